package cases

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// The VolumeSnapshotClass parameter copies: values other than 1 to 3 and
// other parameters are INVALID_ARGUMENT naming them; in all mode (one node)
// copies above 1 is INVALID_ARGUMENT saying it needs cluster mode; nothing
// is made by a refused call; copies "1" is an ordinary snapshot.
func TestSnapshotCopiesParameter(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	ctx := csitest.Ctx(t)
	vol, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "src", CapacityRange: &csi.CapacityRange{RequiredBytes: csitest.Mi}, VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolume().GetVolumeId()
	for _, c := range []struct {
		params map[string]string
		want   string
	}{
		{map[string]string{"copies": "0"}, "from 1 to 3"},
		{map[string]string{"copies": "4"}, "from 1 to 3"},
		{map[string]string{"copies": "two"}, "from 1 to 3"},
		{map[string]string{"replicas": "2"}, `unknown snapshot parameter "replicas"`},
		{map[string]string{"copies": "2"}, "needs cluster mode"},
	} {
		_, err := in.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id, Parameters: c.params})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CreateSnapshot with %v: %v, want INVALID_ARGUMENT saying %q", c.params, err, c.want)
		}
	}
	list, err := in.Controller.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	if err != nil || len(list.GetEntries()) != 0 {
		t.Fatalf("after refused calls: %v, %v; want no snapshot", list, err)
	}
	snap, err := in.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id, Parameters: map[string]string{"copies": "1"}})
	if err != nil || !snap.GetSnapshot().GetReadyToUse() || len(snap.GetSnapshot().GetAccessibleTopology()) != 0 {
		t.Fatalf("copies 1: %v, %v; want a ready snapshot (no topology in all mode)", snap, err)
	}
}
