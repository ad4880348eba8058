package multinode

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// An expansion past the whole node is OUT_OF_RANGE (Kubernetes marks it
// ControllerResizeInfeasible, so the user may lower the request), with a
// message naming the node's room; one past what is left now is
// RESOURCE_EXHAUSTED (retried); neither changes the LocalVolume; a lowered
// request that fits then grows the volume.
func TestExpansionPastTheNodeIsInfeasible(t *testing.T) {
	c := startNodes(t, 100*mi)
	ctx := context.Background()
	v, err := c.create(ctx, "grows", 40*mi, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.create(ctx, "neighbour", 30*mi, nil); err != nil {
		t.Fatal(err)
	}
	id := v.GetVolumeId()
	expand := func(size int64) error {
		_, err := c.ctrl.Controller.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: mnt[0]})
		return err
	}
	specSize := func() int64 {
		lv := &v1.LocalVolume{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: id}, lv); err != nil {
			t.Fatal(err)
		}
		return lv.Spec.Size.Value()
	}

	err = expand(1 << 50)
	if status.Code(err) != codes.OutOfRange || !strings.Contains(status.Convert(err).Message(), "the node holds 104857600 bytes in all (31457280 more available now)") {
		t.Errorf("expanding to 1 PiB on a 100 MiB node: %v, want OutOfRange naming the node's room", err)
	}
	if got := specSize(); got != 40*mi {
		t.Errorf("spec.size after the infeasible expansion: %d, want 40 MiB", got)
	}
	if err := expand(80 * mi); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("growing by 40 MiB with 30 MiB left: %v, want ResourceExhausted", err)
	}
	if got := specSize(); got != 40*mi {
		t.Errorf("spec.size after the refused expansion: %d, want 40 MiB", got)
	}
	if err := expand(60 * mi); err != nil {
		t.Fatalf("the lowered request (60 MiB): %v", err)
	}
	if got := specSize(); got != 60*mi {
		t.Errorf("spec.size after growing to 60 MiB: %d", got)
	}
}
