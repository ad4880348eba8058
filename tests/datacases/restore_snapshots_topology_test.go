package datacases

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

// TestC17RestoreAndCloneHoldTheData: C17. A mount volume holding
// /TESTFILE and a tree with every kind of entry and attribute is
// snapshotted; a restore of the snapshot and a clone of the volume are
// published, and each matches the source file by file (content, modes,
// owners, ns mtimes, xattrs and ACLs, symlinks, hard links, devices,
// holes). Missing sources are NOT_FOUND and leave nothing behind.
func TestC17RestoreAndCloneHoldTheData(t *testing.T) {
	for _, ec := range mountEngines {
		t.Run(ec.name, func(t *testing.T) {
			e := startEngine(t, ec, nil)
			a := e.create("a", 64*csitest.Mi, false)
			aID := a.GetVolumeId()
			sA, tA := e.attach(aID, false)
			testfile := csitest.RandomBytes(17, int(csitest.Mi)+3)
			mustWrite(t, filepath.Join(tA, "TESTFILE"), testfile)
			rich := treecmp.BuildRich(t, filepath.Join(tA, "tree"), filepath.Join(e.dir, "outside"))
			snap := e.snapshot("s", aID)
			if snap.GetSizeBytes() != 64*csitest.Mi {
				t.Errorf("snapshot size_bytes %d, want 64Mi (the source's size)", snap.GetSizeBytes())
			}

			r, err := e.createReq(&csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: csitest.FromSnapshot(snap.GetSnapshotId())})
			csitest.MustCode(t, err, codes.OK, "CreateVolume from snapshot")
			c, err := e.createReq(&csi.CreateVolumeRequest{Name: "c", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: csitest.FromVolume(aID)})
			csitest.MustCode(t, err, codes.OK, "CreateVolume from volume")
			for _, v := range []*csi.Volume{r, c} {
				if v.GetCapacityBytes() != 64*csitest.Mi {
					t.Errorf("%s: capacity %d, want the source's 64Mi (no capacity_range)", v.GetVolumeId(), v.GetCapacityBytes())
				}
			}
			if got := r.GetContentSource().GetSnapshot().GetSnapshotId(); got != snap.GetSnapshotId() {
				t.Errorf("restore: content_source snapshot %q, want %q", got, snap.GetSnapshotId())
			}
			if got := c.GetContentSource().GetVolume().GetVolumeId(); got != aID {
				t.Errorf("clone: content_source volume %q, want %q", got, aID)
			}
			sR, tR := e.attach(r.GetVolumeId(), false)
			sC, tC := e.attach(c.GetVolumeId(), false)
			for _, tgt := range []string{tR, tC} {
				assertFile(t, filepath.Join(tgt, "TESTFILE"), testfile)
				treecmp.Compare(t, tA, tgt, treecmp.Options{})
			}
			// Absolute symlinks were copied, not followed.
			if got, err := os.Readlink(filepath.Join(tR, "tree", "sym-abs")); err != nil || got != rich.SecretFile {
				t.Errorf("restored sym-abs: %q, %v; want a link to %s", got, err, rich.SecretFile)
			}
			// The copies are independent of the source and of each other.
			mustWrite(t, filepath.Join(tR, "TESTFILE"), []byte("changed in the restore"))
			assertFile(t, filepath.Join(tA, "TESTFILE"), testfile)
			assertFile(t, filepath.Join(tC, "TESTFILE"), testfile)

			// Missing sources.
			for _, src := range []*csi.VolumeContentSource{
				csitest.FromSnapshot("non-existing-snapshot-id"), csitest.FromSnapshot("snap-00000000000000000000000000000000"),
				csitest.FromVolume("no-vol"), csitest.FromVolume("vol-00000000000000000000000000000000"),
			} {
				_, err := e.createReq(&csi.CreateVolumeRequest{Name: "missing", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src})
				csitest.CodeIs(t, err, codes.NotFound, "CreateVolume from "+src.String())
			}
			e.assertVolumes(aID, r.GetVolumeId(), c.GetVolumeId())

			e.detach(r.GetVolumeId(), sR, tR)
			e.detach(c.GetVolumeId(), sC, tC)
			e.detach(aID, sA, tA)
			for _, id := range []string{aID, r.GetVolumeId(), c.GetVolumeId()} {
				e.deleteVolume(id)
			}
			e.deleteSnapshot(snap.GetSnapshotId())
			e.assertVolumes()
			if n := csitest.DirNames(t, filepath.Join(e.root, "snapshots")); len(n) != 0 {
				t.Errorf("snapshots left on disk after DeleteSnapshot: %v", n)
			}
		})
	}
}

// TestC18DeleteVolumeWithSnapshots: C18. Deleting a volume that has a
// snapshot succeeds (option a of the case), and the snapshot stays fully
// usable: listed by id and by source with source_volume_id = A and
// ready_to_use, and restorable with A's data. Mount volumes on both
// engines, and a block volume.
func TestC18DeleteVolumeWithSnapshots(t *testing.T) {
	type kase struct {
		engineCase
		block bool
	}
	cases := []kase{{engineCase: mountEngines[0]}, {engineCase: mountEngines[1]}, {engineCase: engineCase{name: "block", engine: "auto"}, block: true}}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			e := startEngine(t, k.engineCase, nil)
			a := e.create("a", 8*csitest.Mi, k.block)
			aID := a.GetVolumeId()
			sA, tA := e.attach(aID, k.block)
			data := csitest.RandomBytes(18, 3*int(csitest.Mi)+5)
			if k.block {
				writeDevAt(t, tA, 0, data)
			} else {
				mustWrite(t, filepath.Join(tA, "F"), data)
			}
			e.detach(aID, sA, tA)
			snap := e.snapshot("s", aID)
			sID := snap.GetSnapshotId()

			_, err := e.ctl().DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: aID})
			csitest.MustCode(t, err, codes.OK, "DeleteVolume A with a snapshot")
			csitest.AssertGone(t, e.volDir(aID))
			csitest.AssertGone(t, e.imagePath(aID))
			e.assertVolumes()

			for _, req := range []*csi.ListSnapshotsRequest{{SnapshotId: sID}, {SourceVolumeId: aID}} {
				resp, err := e.ctl().ListSnapshots(csitest.Ctx(t), req)
				csitest.MustCode(t, err, codes.OK, "ListSnapshots "+req.String())
				if len(resp.GetEntries()) != 1 {
					t.Fatalf("ListSnapshots %v: %d entries, want 1", req, len(resp.GetEntries()))
				}
				s := resp.GetEntries()[0].GetSnapshot()
				if s.GetSnapshotId() != sID || s.GetSourceVolumeId() != aID || !s.GetReadyToUse() || s.GetSizeBytes() != 8*csitest.Mi {
					t.Errorf("ListSnapshots %v: %v, want %s of %s, ready, 8Mi", req, s, sID, aID)
				}
			}
			r, err := e.createReq(&csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(k.block)}, VolumeContentSource: csitest.FromSnapshot(sID)})
			csitest.MustCode(t, err, codes.OK, "restore of the snapshot of the deleted volume")
			sR, tR := e.attach(r.GetVolumeId(), k.block)
			if k.block {
				assertBytes(t, "restored block volume", readDev(t, tR, 0, len(data)), data)
			} else {
				assertFile(t, filepath.Join(tR, "F"), data)
			}
			e.detach(r.GetVolumeId(), sR, tR)
			e.deleteVolume(r.GetVolumeId())
			e.deleteSnapshot(sID)
		})
	}
}

// TestC20TopologyExcludesThisNode: C20 on a single node. A CreateVolume
// whose accessibility_requirements admit only another node gets
// RESOURCE_EXHAUSTED (the provisioner reschedules; NOT_FOUND would be
// final), for a plain create, a restore and a clone, and creates nothing.
// Requirements that admit this node work and report its topology.
func TestC20TopologyExcludesThisNode(t *testing.T) {
	e := start(t, "", 0, func(o *driver.Options) { o.CapacityBytes = 1 << 30 })
	a := e.create("a", 4*csitest.Mi, false)
	aID := a.GetVolumeId()
	snap := e.snapshot("s", aID)
	avail := e.available()
	topo := func(node string) *csi.Topology {
		return &csi.Topology{Segments: map[string]string{driver.TopologyKey: node}}
	}
	other, here := topo("other-node"), topo(e.in.Opts.NodeID)
	sources := map[string]*csi.VolumeContentSource{
		"plain": nil, "restore": csitest.FromSnapshot(snap.GetSnapshotId()), "clone": csitest.FromVolume(aID),
	}
	reqs := map[string]*csi.TopologyRequirement{
		"requisite+preferred": {Requisite: []*csi.Topology{other}, Preferred: []*csi.Topology{other}},
		"requisite only":      {Requisite: []*csi.Topology{other}},
	}
	for sname, src := range sources {
		for rname, tr := range reqs {
			for _, block := range []bool{false, true} {
				if block && src != nil {
					continue // the sources are mount volumes
				}
				_, err := e.createReq(&csi.CreateVolumeRequest{
					Name: "x-" + sname + "-" + rname, CapacityRange: csitest.Range(4*csitest.Mi, 0),
					VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)}, VolumeContentSource: src, AccessibilityRequirements: tr,
				})
				csitest.CodeIs(t, err, codes.ResourceExhausted, sname+" create ("+rname+", block="+map[bool]string{true: "yes", false: "no"}[block]+") for another node")
			}
		}
	}
	e.assertVolumes(aID)
	if got := e.available(); got != avail {
		t.Errorf("GetCapacity changed by refused creates: %d, was %d", got, avail)
	}
	// Admitting this node among others works; the volume reports it.
	var made []string
	for sname, src := range sources {
		v, err := e.createReq(&csi.CreateVolumeRequest{
			Name: "y-" + sname, CapacityRange: csitest.Range(4*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src,
			AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{other, here}, Preferred: []*csi.Topology{other, here}},
		})
		csitest.MustCode(t, err, codes.OK, sname+" create admitting this node")
		if at := v.GetAccessibleTopology(); len(at) != 1 || at[0].GetSegments()[driver.TopologyKey] != e.in.Opts.NodeID {
			t.Errorf("%s: accessible_topology %v, want this node only", sname, at)
		}
		made = append(made, v.GetVolumeId())
	}
	e.assertVolumes(append(slices.Clone(made), aID)...)
	for _, id := range append(made, aID) {
		e.deleteVolume(id)
	}
	e.deleteSnapshot(snap.GetSnapshotId())
}
