package multinode

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// Volume group snapshots in cluster mode: the controller records a
// LocalGroupSnapshot, the node holding the volumes cuts it and creates a
// LocalSnapshot per member; the group is found, restored from, listed and
// deleted through CSI; volumes on different nodes are FAILED_PRECONDITION.
func TestGroupSnapshotOnOneNode(t *testing.T) {
	c := startNodes(t, 100*mi, 100*mi)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	var ids []string
	for _, n := range []string{"a", "b"} {
		v, err := c.create(ctx, n, 10*mi, pin("node-0"))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.GetVolumeId())
	}
	other, err := c.create(ctx, "elsewhere", 10*mi, pin("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	caps, err := c.ctrl.Identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil || !strings.Contains(caps.String(), "GROUP_CONTROLLER_SERVICE") {
		t.Fatalf("controller mode capabilities %v (%v): want GROUP_CONTROLLER_SERVICE", caps, err)
	}
	gc := csi.NewGroupControllerClient(c.ctrl.Conn)
	r, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "pair", SourceVolumeIds: ids})
	if err != nil {
		t.Fatal(err)
	}
	g := r.GetGroupSnapshot()
	if !g.GetReadyToUse() || len(g.GetSnapshots()) != 2 {
		t.Fatalf("group %v: want ready with two snapshots", g)
	}
	var snapIDs []string
	for _, s := range g.GetSnapshots() {
		snapIDs = append(snapIDs, s.GetSnapshotId())
		if s.GetGroupSnapshotId() != g.GetGroupSnapshotId() || !s.GetReadyToUse() {
			t.Errorf("member %v: want ready, of group %s", s, g.GetGroupSnapshotId())
		}
		ls := &v1.LocalSnapshot{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: s.GetSnapshotId()}, ls); err != nil || ls.Spec.GroupSnapshot != g.GetGroupSnapshotId() || ls.Spec.Node != "node-0" {
			t.Errorf("LocalSnapshot of member %s: %+v (%v)", s.GetSnapshotId(), ls.Spec, err)
		}
		if _, err := os.Stat(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "snapshots", s.GetSnapshotId())); err != nil {
			t.Errorf("member %s has no data on node-0: %v", s.GetSnapshotId(), err)
		}
	}
	again, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "pair", SourceVolumeIds: []string{ids[1], ids[0]}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != g.GetGroupSnapshotId() {
		t.Errorf("repeated create: %v (%v), want group %s", again, err, g.GetGroupSnapshotId())
	}
	_, err = gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "split", SourceVolumeIds: []string{ids[0], other.GetVolumeId()}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "different nodes") {
		t.Errorf("a group over two nodes: %v, want FAILED_PRECONDITION naming the nodes", err)
	}
	restored, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", VolumeCapabilities: mnt,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapIDs[0]}}}})
	if err != nil || nodeOfVol(restored.GetVolume()) != "node-0" {
		t.Errorf("restore of a member: %v (%v), want a volume on node-0", restored, err)
	}
	got, err := gc.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: snapIDs})
	if err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("GetVolumeGroupSnapshot: %v (%v)", got, err)
	}
	if _, err := gc.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: snapIDs[:1]}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("delete naming one of two members: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := gc.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: snapIDs}); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); status.Code(err) != codes.NotFound {
		t.Errorf("the deleted group: %v, want NOT_FOUND", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, id := range snapIDs {
		p := filepath.Join(c.nodes["node-0"].Opts.DataRoot, "snapshots", id)
		for _, err := os.Stat(p); err == nil; _, err = os.Stat(p) {
			if time.Now().After(deadline) {
				t.Fatalf("member %s still has data on node-0 after the group was deleted", id)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
