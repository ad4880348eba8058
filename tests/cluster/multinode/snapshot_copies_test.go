package multinode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

// TestSnapshotCopiesSurviveNodeLoss: snapshots of a class with copies "2"
// (a raw block volume and a directory volume) are kept on a second node,
// the one with the most room; their accessible_topology names both nodes
// once the copy is verified. The snapshot's node is then lost (its node
// plugin stopped, its data root wiped, its heartbeat old): each snapshot
// restores on the copy's node (a local restore) and on a third node
// (pulled from the copy), byte for byte. Deleting a snapshot removes the
// copy's data even while the lost node's own data cannot be reached.
func TestSnapshotCopiesSurviveNodeLoss(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c := startTransferNodes(t, 300*mi, 400*mi, 200*mi)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	root := func(n string) string { return c.nodes[n].Opts.DataRoot }

	type source struct {
		name, snapID string
		caps         []*csi.VolumeCapability
		check        func(t *testing.T, root, volID string)
	}
	var sources []*source

	// A raw block volume with data at an offset, and a directory volume.
	blockData := treecmp.RandomBytes(11, 5*mi+77)
	dirData := treecmp.RandomBytes(12, 2*mi+5)
	for _, s := range []*source{
		{name: "block", caps: blk, check: func(t *testing.T, root, volID string) {
			b, err := os.ReadFile(filepath.Join(root, "block", volID+".img"))
			if err != nil || len(b) != 64*mi || !bytes.Equal(b[3*mi:3*mi+len(blockData)], blockData) {
				t.Errorf("restored image on %s differs (%d bytes, %v)", root, len(b), err)
			}
		}},
		{name: "dir", caps: mnt, check: func(t *testing.T, root, volID string) {
			b, err := os.ReadFile(filepath.Join(root, "volumes", volID, "sub", "file"))
			if err != nil || !bytes.Equal(b, dirData) {
				t.Errorf("restored directory on %s differs (%d bytes, %v)", root, len(b), err)
			}
		}},
	} {
		resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "src-" + s.name, VolumeCapabilities: s.caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi}, AccessibilityRequirements: pin("node-0"),
		})
		if err != nil {
			t.Fatal(err)
		}
		id := resp.GetVolume().GetVolumeId()
		if s.name == "block" {
			f, err := os.OpenFile(filepath.Join(root("node-0"), "block", id+".img"), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(blockData, 3*mi); err != nil {
				t.Fatal(err)
			}
			f.Close()
		} else {
			d := filepath.Join(root("node-0"), "volumes", id, "sub")
			if err := os.Mkdir(d, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(d, "file"), dirData, 0o640); err != nil {
				t.Fatal(err)
			}
		}
		snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{
			Name: "snap-" + s.name, SourceVolumeId: id, Parameters: map[string]string{"copies": "2"},
		})
		if err != nil {
			t.Fatal(err)
		}
		s.snapID = snap.GetSnapshot().GetSnapshotId()
		sources = append(sources, s)
	}

	// Each copy lands on node-1 (the most room), complete and verified.
	for _, s := range sources {
		cp := &v1.LocalSnapshot{}
		name := contract.SnapshotCopyName(s.snapID, "node-1")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			err := c.env.Client.Get(ctx, client.ObjectKey{Name: name}, cp)
			if err == nil && (cp.Status.ReadyToUse || cp.Status.Phase == v1.PhaseFailed) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: copy %s on node-1 not ready: %v, %+v", s.name, name, err, cp.Status)
			}
		}
		if !cp.Status.ReadyToUse || cp.Spec.CopyOf != s.snapID || cp.Status.Transfer == nil || cp.Status.Transfer.CompletionTime == nil || cp.Status.Transfer.SourceNode != "node-0" {
			t.Fatalf("%s: copy %+v %+v, want a ready copy of %s from node-0", s.name, cp.Spec, cp.Status, s.snapID)
		}
		resp, err := c.ctrl.Controller.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: s.snapID})
		if err != nil || len(resp.GetEntries()) != 1 {
			t.Fatalf("ListSnapshots %s: %v, %v", s.snapID, resp, err)
		}
		if got := topologyNodes(resp.GetEntries()[0].GetSnapshot()); !slices.Equal(got, []string{"node-0", "node-1"}) {
			t.Errorf("%s: accessible_topology %v, want node-0 and node-1", s.name, got)
		}
		for _, n := range []string{"node-2"} {
			if err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.SnapshotCopyName(s.snapID, n)}, &v1.LocalSnapshot{}); err == nil {
				t.Errorf("%s: a copy on %s too, want one copy", s.name, n)
			}
		}
	}
	var snapFiles []string
	for _, s := range sources {
		p := filepath.Join(root("node-1"), "snapshots", s.snapID)
		if s.name == "block" {
			p += ".img"
			a, _ := os.ReadFile(filepath.Join(root("node-0"), "snapshots", s.snapID+".img"))
			b, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("the copy's image on node-1 differs from the snapshot's on node-0 (%v)", err)
			}
		} else if b, err := os.ReadFile(filepath.Join(p, "sub", "file")); err != nil || !bytes.Equal(b, dirData) {
			t.Errorf("the copy's directory on node-1 differs (%v)", err)
		}
		snapFiles = append(snapFiles, p)
	}

	// node-0 is lost: its plugin stopped, its data root wiped, its
	// heartbeat old.
	c.nodes["node-0"].Stop(t)
	ents, err := os.ReadDir(root("node-0"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(root("node-0"), e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	ln := &v1.LocalNode{}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: "node-0"}, ln); err != nil {
		t.Fatal(err)
	}
	old := ln.DeepCopy()
	ln.Status.Heartbeat.Time = time.Now().Add(-11 * time.Minute)
	if err := c.env.Client.Status().Patch(ctx, ln, client.MergeFrom(old)); err != nil {
		t.Fatal(err)
	}

	for _, s := range sources {
		for _, target := range []struct{ node, from string }{{"node-1", ""}, {"node-2", "node-1"}} {
			cs := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s.snapID}}}
			var v *csi.Volume
			for deadline := time.Now().Add(2 * time.Minute); ; {
				resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
					Name: "restore-" + s.name + "-" + target.node, VolumeCapabilities: s.caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi},
					VolumeContentSource: cs, AccessibilityRequirements: pin(target.node),
				})
				if code := status.Code(err); (code == codes.DeadlineExceeded || code == codes.Aborted) && time.Now().Before(deadline) {
					continue
				}
				if err != nil {
					t.Fatalf("%s: restore onto %s with node-0 lost: %v", s.name, target.node, err)
				}
				v = resp.GetVolume()
				break
			}
			if nodeOfVol(v) != target.node {
				t.Fatalf("%s: restored onto %s, want %s", s.name, nodeOfVol(v), target.node)
			}
			lv := &v1.LocalVolume{}
			if err := c.env.Client.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, lv); err != nil {
				t.Fatal(err)
			}
			if lv.Spec.ContentSource == nil || lv.Spec.ContentSource.Node != target.from {
				t.Errorf("%s onto %s: content source %+v, want the data from %q", s.name, target.node, lv.Spec.ContentSource, target.from)
			}
			s.check(t, root(target.node), v.GetVolumeId())
		}
	}

	// Deleting a snapshot removes its copy: the copy's object and data
	// go; the lost node's own object waits for that node.
	for i, s := range sources {
		if _, err := c.ctrl.Controller.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.snapID}); err != nil {
			t.Fatal(err)
		}
		name := contract.SnapshotCopyName(s.snapID, "node-1")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			err := c.env.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.LocalSnapshot{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the copy's object is still there after DeleteSnapshot (%v)", s.name, err)
			}
		}
		if _, err := os.Stat(snapFiles[i]); !os.IsNotExist(err) {
			t.Errorf("%s: the copy's data %s is still on node-1 (%v)", s.name, snapFiles[i], err)
		}
		ls := &v1.LocalSnapshot{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: s.snapID}, ls); err != nil || !ls.Spec.DeleteData {
			t.Errorf("%s: the snapshot's own object: %v, deleteData %v; want it waiting for node-0", s.name, err, ls.Spec.DeleteData)
		}
	}
}

// topologyNodes lists the nodes of a snapshot's accessible_topology.
func topologyNodes(s *csi.Snapshot) []string {
	var out []string
	for _, t := range s.GetAccessibleTopology() {
		out = append(out, t.GetSegments()[contract.TopologyKey])
	}
	return out
}

// TestSnapshotCopyWaitsForRoom: with copies "2" and no other node with
// room for the snapshot, the snapshot is ready on its own node alone (its
// accessible_topology in ListSnapshots says so) and no copy is placed; once the other node
// has room (a volume there deleted), the controller's next pass places the
// copy there and the topology names both nodes.
func TestSnapshotCopyWaitsForRoom(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c := startTransferNodes(t, 200*mi, 100*mi)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	filler, err := c.create(ctx, "filler", 80*mi, pin("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := c.create(ctx, "src", 64*mi, pin("node-0"))
	if err != nil {
		t.Fatal(err)
	}
	data := treecmp.RandomBytes(21, mi+3)
	if err := os.WriteFile(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "volumes", src.GetVolumeId(), "file"), data, 0o640); err != nil {
		t.Fatal(err)
	}
	snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{
		Name: "snap", SourceVolumeId: src.GetVolumeId(), Parameters: map[string]string{"copies": "2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := snap.GetSnapshot().GetSnapshotId()
	if !snap.GetSnapshot().GetReadyToUse() {
		t.Errorf("snapshot not ready at CreateSnapshot with no room for its copy")
	}
	name := contract.SnapshotCopyName(id, "node-1")
	time.Sleep(3 * time.Second)
	if resp, err := c.ctrl.Controller.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: id}); err != nil || len(resp.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots: %v, %v", resp, err)
	} else if got := topologyNodes(resp.GetEntries()[0].GetSnapshot()); !slices.Equal(got, []string{"node-0"}) {
		t.Errorf("accessible_topology %v, want node-0 alone", got)
	}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.LocalSnapshot{}); !apierrors.IsNotFound(err) {
		t.Fatalf("a copy on node-1 without room for it: %v", err)
	}

	if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: filler.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	cp := &v1.LocalSnapshot{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		err := c.env.Client.Get(ctx, client.ObjectKey{Name: name}, cp)
		if err == nil && (cp.Status.ReadyToUse || cp.Status.Phase == v1.PhaseFailed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready copy on node-1 after room was made: %v, %+v", err, cp.Status)
		}
	}
	if !cp.Status.ReadyToUse {
		t.Fatalf("copy failed: %+v", cp.Status)
	}
	if b, err := os.ReadFile(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "snapshots", id, "file")); err != nil || !bytes.Equal(b, data) {
		t.Errorf("the copy on node-1 differs (%d bytes, %v)", len(b), err)
	}
	resp, err := c.ctrl.Controller.ListSnapshots(ctx, &csi.ListSnapshotsRequest{SnapshotId: id})
	if err != nil || len(resp.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots: %v, %v", resp, err)
	}
	if got := topologyNodes(resp.GetEntries()[0].GetSnapshot()); !slices.Equal(got, []string{"node-0", "node-1"}) {
		t.Errorf("accessible_topology %v, want node-0 and node-1", got)
	}
}

// TestSnapshotCopyIncremental: the copy of a second snapshot of a 1 GiB
// raw block volume, 16 MiB of which changed since the first was copied,
// carries about those 16 MiB (at most 32 MiB), not the 80 MiB written;
// the copy reads as the snapshot on its node, byte for byte, and a
// restore from it on the copy's node has the new data.
func TestSnapshotCopyIncremental(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c := startTransferNodes(t, 4<<30, 4<<30)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "big", VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, AccessibilityRequirements: pin("node-0"),
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	img := filepath.Join(c.nodes["node-0"].Opts.DataRoot, "block", id+".img")
	write := func(seed uint64, n int, off int64) {
		f, err := os.OpenFile(img, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(treecmp.RandomBytes(seed, n), off); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 64*mi, 100*mi)
	copyOf := func(name string) (string, *v1.LocalSnapshot) {
		snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id, Parameters: map[string]string{"copies": "2"}})
		if err != nil {
			t.Fatal(err)
		}
		sid := snap.GetSnapshot().GetSnapshotId()
		return sid, readyCopy(t, c, sid, "node-1")
	}
	_, first := copyOf("first")
	write(2, 10*mi, 110*mi) // rewritten
	write(3, 6*mi, 600*mi)  // where the first snapshot has a hole
	second, cp := copyOf("second")
	full, moved := first.Status.Transfer.BytesDone.Value(), cp.Status.Transfer.BytesDone.Value()
	t.Logf("first copy: %d bytes; second, incremental: %d bytes", full, moved)
	if full < 64*mi || moved > 32*mi || moved < 16*mi {
		t.Errorf("copies carried %d then %d bytes; want the whole 64 MiB, then 16 to 32 MiB", full, moved)
	}
	a, err := os.ReadFile(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "snapshots", second+".img"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "snapshots", second+".img"))
	if err != nil || !bytes.Equal(a, b) {
		t.Fatalf("the incremental copy on node-1 differs from the snapshot on node-0 (%v)", err)
	}
	r, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "restored", VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, AccessibilityRequirements: pin("node-1"),
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: second}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "block", r.GetVolume().GetVolumeId()+".img"))
	if err != nil || !bytes.Equal(got, a) {
		t.Errorf("the restore on node-1 differs from the snapshot (%v)", err)
	}
}

// TestSnapshotCopySurvivesNodePluginRestarts stops the snapshot's node
// plugin, then the copy's, in the middle of a copy (slowed down by the
// volume's transferBandwidth, which copies obey too): each time the copy
// starts over once the plugin is back and ends ready, byte for byte, with
// nothing half-made left on the copy's node.
func TestSnapshotCopySurvivesNodePluginRestarts(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c := startTransferNodes(t, 500*mi, 500*mi)
	ctx := context.Background()
	parent := t
	for i, side := range []string{"node-0", "node-1"} {
		t.Run("stop "+side, func(t *testing.T) {
			resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
				Name: "copied-" + side, VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi},
				AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}},
				Parameters:                map[string]string{contract.ParamTransferBandwidth: "2Mi"},
			})
			if err != nil {
				t.Fatal(err)
			}
			img := filepath.Join(c.nodes["node-0"].Opts.DataRoot, "block", resp.GetVolume().GetVolumeId()+".img")
			f, err := os.OpenFile(img, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(treecmp.RandomBytes(uint64(30+i), 24*mi), 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{
				Name: "snap-" + side, SourceVolumeId: resp.GetVolume().GetVolumeId(), Parameters: map[string]string{"copies": "2"},
			})
			if err != nil {
				t.Fatal(err)
			}
			id := snap.GetSnapshot().GetSnapshotId()
			name := contract.SnapshotCopyName(id, "node-1")
			wait := func(what string, cond func(*v1.LocalSnapshot) bool) *v1.LocalSnapshot {
				cp := &v1.LocalSnapshot{}
				for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
					err := c.env.Client.Get(ctx, client.ObjectKey{Name: name}, cp)
					if err == nil && cond(cp) {
						return cp
					}
					if time.Now().After(deadline) {
						t.Fatalf("copy %s: %s did not happen (%v, %+v)", name, what, err, cp.Status)
					}
				}
			}
			wait("bytes arriving", func(cp *v1.LocalSnapshot) bool {
				return cp.Status.Transfer != nil && cp.Status.Transfer.BytesDone.Value() > 0 && cp.Status.Transfer.CompletionTime == nil
			})
			p := c.nodes[side]
			p.Stop(t)
			time.Sleep(time.Second)
			c.nodes[side] = c.env.StartNodeWith(parent, p.Dir, p.Opts)
			cp := wait("ready", func(cp *v1.LocalSnapshot) bool { return cp.Status.ReadyToUse || cp.Status.Phase == v1.PhaseFailed })
			if !cp.Status.ReadyToUse || cp.Status.Transfer.Attempts < 2 {
				t.Fatalf("copy after %s restarted: %+v, want ready after two attempts or more", side, cp.Status)
			}
			a, err := os.ReadFile(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "snapshots", id+".img"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "snapshots", id+".img"))
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("the copy on node-1 differs from the snapshot (%v)", err)
			}
			ents, err := os.ReadDir(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "snapshots"))
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".creating-") {
					t.Errorf("left behind on node-1: %s", e.Name())
				}
			}
		})
	}
}

// readyCopy waits until the copy of snapshot sid on node is ready and
// returns it; a failed copy or none within two minutes fails t.
func readyCopy(t testing.TB, c *fixture, sid, node string) *v1.LocalSnapshot {
	t.Helper()
	cp := &v1.LocalSnapshot{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: contract.SnapshotCopyName(sid, node)}, cp)
		if err == nil && (cp.Status.ReadyToUse || cp.Status.Phase == v1.PhaseFailed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("copy of %s on %s not ready: %v %+v", sid, node, err, cp.Status)
		}
	}
	if !cp.Status.ReadyToUse {
		t.Fatalf("copy of %s on %s failed: %+v", sid, node, cp.Status)
	}
	return cp
}

// TestGroupSnapshotCopies: a volume group snapshot whose class has copies
// "2" keeps every member on a second node too (the node plugin that cuts
// the group never asks for copies: the controller reads them from the
// group); GetVolumeGroupSnapshot's members name both nodes once the
// copies are verified; with the group's node lost, each member restores
// on the copy's node byte for byte; deleting the group removes the
// copies' objects and data.
func TestGroupSnapshotCopies(t *testing.T) {
	t.Parallel() // mostly waits (copies, rechecks): runs beside the others
	c := startTransferNodes(t, 300*mi, 300*mi)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	root := func(n string) string { return c.nodes[n].Opts.DataRoot }
	blockData, dirData := treecmp.RandomBytes(31, 3*mi+9), treecmp.RandomBytes(32, mi+1)
	var ids []string
	for i, caps := range [][]*csi.VolumeCapability{blk, mnt} {
		resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: fmt.Sprintf("member-%d", i), VolumeCapabilities: caps,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mi}, AccessibilityRequirements: pin("node-0"),
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.GetVolume().GetVolumeId())
	}
	f, err := os.OpenFile(filepath.Join(root("node-0"), "block", ids[0]+".img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(blockData, 2*mi); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.WriteFile(filepath.Join(root("node-0"), "volumes", ids[1], "file"), dirData, 0o640); err != nil {
		t.Fatal(err)
	}

	gc := csi.NewGroupControllerClient(c.ctrl.Conn)
	r, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "pair", SourceVolumeIds: ids, Parameters: map[string]string{"copies": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	g := r.GetGroupSnapshot()
	members := map[string]string{} // source volume → member snapshot
	for _, s := range g.GetSnapshots() {
		members[s.GetSourceVolumeId()] = s.GetSnapshotId()
		readyCopy(t, c, s.GetSnapshotId(), "node-1")
	}
	if len(members) != 2 {
		t.Fatalf("group %v: want two members", g)
	}
	got, err := gc.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range got.GetGroupSnapshot().GetSnapshots() {
		if n := topologyNodes(s); !slices.Equal(n, []string{"node-0", "node-1"}) {
			t.Errorf("member %s: accessible_topology %v, want node-0 and node-1", s.GetSnapshotId(), n)
		}
	}

	// node-0 is lost: its plugin stopped, its data root wiped.
	c.nodes["node-0"].Stop(t)
	if err := os.RemoveAll(filepath.Join(root("node-0"), "snapshots")); err != nil {
		t.Fatal(err)
	}
	for i, caps := range [][]*csi.VolumeCapability{blk, mnt} {
		resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: fmt.Sprintf("restored-%d", i), VolumeCapabilities: caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mi}, AccessibilityRequirements: pin("node-1"),
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: members[ids[i]]}}},
		})
		if err != nil {
			t.Fatalf("restore of member %s on node-1 with node-0 lost: %v", members[ids[i]], err)
		}
		vid := resp.GetVolume().GetVolumeId()
		if i == 0 {
			b, err := os.ReadFile(filepath.Join(root("node-1"), "block", vid+".img"))
			if err != nil || !bytes.Equal(b[2*mi:2*mi+len(blockData)], blockData) {
				t.Errorf("the restored block member on node-1 differs (%v)", err)
			}
		} else if b, err := os.ReadFile(filepath.Join(root("node-1"), "volumes", vid, "file")); err != nil || !bytes.Equal(b, dirData) {
			t.Errorf("the restored directory member on node-1 differs (%v)", err)
		}
	}

	if _, err := gc.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	for _, sid := range members {
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.SnapshotCopyName(sid, "node-1")}, &v1.LocalSnapshot{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the copy of member %s is still there after DeleteVolumeGroupSnapshot (%v)", sid, err)
			}
		}
		for _, p := range []string{sid, sid + ".img"} {
			if _, err := os.Stat(filepath.Join(root("node-1"), "snapshots", p)); !os.IsNotExist(err) {
				t.Errorf("the copy's data %s is still on node-1 (%v)", p, err)
			}
		}
	}
}
