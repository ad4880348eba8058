package datacases

import (
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
)

func diskEnv(t *testing.T) *env {
	return start(t, "", 0, func(o *driver.Options) { o.CapacityBytes = 1 << 30 })
}

// TestBlockSnapshotStatsAndDelete covers the block halves of C04, C19 and
// C32 on one 4 MiB block volume A holding a pattern P written through its
// published device node:
//   - C32: NodeGetVolumeStats at the device gives BYTES total 4194304.
//   - C04: DeleteVolume while staged and published is FAILED_PRECONDITION,
//     and the image, its loop device and P are untouched.
//   - C19: CreateSnapshot "s1" twice gives one snapshot_id, ready_to_use,
//     size_bytes 4Mi; "s1" of another volume is ALREADY_EXISTS; restoring
//     s1 as block gives P byte for byte; as a mount volume INVALID_ARGUMENT.
func TestBlockSnapshotStatsAndDelete(t *testing.T) {
	e := diskEnv(t)
	a := e.create("a", 4*csitest.Mi, true)
	aID := a.GetVolumeId()
	sA, tA := e.attach(aID, true)
	if got := devSize(t, tA); got != 4*csitest.Mi {
		t.Errorf("published device: %d bytes, want 4Mi", got)
	}
	p := csitest.RandomBytes(19, int(4*csitest.Mi))

	// C32, block: after writing 1Mi of the 4Mi volume, the BYTES entry has
	// total 4194304 and counts what was written (the image is
	// preallocated, so its allocated blocks would say "full"). ext4 may
	// write zeros into a small unwritten piece next to a write instead of
	// splitting its extent (up to 32 KiB on each side, extent_max_zeroout_kb),
	// which then counts as written: up to 1Mi+128Ki (CI saw 1Mi+68Ki).
	writeDevAt(t, tA, 0, p[:csitest.Mi])
	st, err := e.node().NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: aID, VolumePath: tA})
	csitest.MustCode(t, err, codes.OK, "NodeGetVolumeStats at the published device")
	var byteUsage *csi.VolumeUsage
	for _, u := range st.GetUsage() {
		if u.GetUnit() == csi.VolumeUsage_BYTES {
			byteUsage = u
		}
	}
	if byteUsage == nil || byteUsage.GetTotal() != 4194304 {
		t.Errorf("NodeGetVolumeStats: %v, want a BYTES entry with total 4194304", st.GetUsage())
	} else if u := byteUsage; u.GetUsed() < csitest.Mi || u.GetUsed() > csitest.Mi+128*csitest.Ki || u.GetAvailable() != u.GetTotal()-u.GetUsed() {
		t.Errorf("NodeGetVolumeStats BYTES after writing 1Mi: used %d, available %d; want used in [1Mi, 1Mi+128Ki] and available = total - used", u.GetUsed(), u.GetAvailable())
	}
	writeDevAt(t, tA, csitest.Mi, p[csitest.Mi:])
	_, err = e.node().NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: aID, VolumePath: "some/path"})
	csitest.CodeIs(t, err, codes.NotFound, "NodeGetVolumeStats with a relative path")

	// C04, block.
	dev := loopOf(t, e.imagePath(aID))
	_, err = e.ctl().DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: aID})
	csitest.CodeIs(t, err, codes.FailedPrecondition, "DeleteVolume of a staged and published block volume")
	e.assertBacking(aID, true, 4*csitest.Mi)
	if got := loopOf(t, e.imagePath(aID)); got != dev {
		t.Errorf("loop device after the refused delete: %q, want %q", got, dev)
	}
	e.assertPublished(aID, tA, true)
	assertBytes(t, "pattern after the refused delete", readDev(t, tA, 0, len(p)), p)

	// C19.
	s1 := e.snapshot("s1", aID)
	again := e.snapshot("s1", aID)
	if again.GetSnapshotId() != s1.GetSnapshotId() {
		t.Errorf("repeated CreateSnapshot s1: id %s, want %s", again.GetSnapshotId(), s1.GetSnapshotId())
	}
	for _, s := range []*csi.Snapshot{s1, again} {
		if s.GetSizeBytes() != 4*csitest.Mi || !s.GetReadyToUse() {
			t.Errorf("snapshot s1: size_bytes %d ready %v, want 4Mi and ready", s.GetSizeBytes(), s.GetReadyToUse())
		}
	}
	b := e.create("b", 4*csitest.Mi, true)
	_, err = e.ctl().CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: b.GetVolumeId()})
	csitest.CodeIs(t, err, codes.AlreadyExists, "CreateSnapshot s1 of another volume")
	r, err := e.createReq(&csi.CreateVolumeRequest{Name: "r", VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}, VolumeContentSource: csitest.FromSnapshot(s1.GetSnapshotId())})
	csitest.MustCode(t, err, codes.OK, "restore s1 as block")
	if r.GetCapacityBytes() != 4*csitest.Mi {
		t.Errorf("restore: capacity %d, want 4Mi", r.GetCapacityBytes())
	}
	sR, tR := e.attach(r.GetVolumeId(), true)
	assertBytes(t, "restored block volume", readDev(t, tR, 0, len(p)), p)
	_, err = e.createReq(&csi.CreateVolumeRequest{Name: "m", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: csitest.FromSnapshot(s1.GetSnapshotId())})
	csitest.CodeIs(t, err, codes.InvalidArgument, "restore of a block snapshot as a mount volume")
	e.assertVolumes(aID, b.GetVolumeId(), r.GetVolumeId())

	e.detach(r.GetVolumeId(), sR, tR)
	e.detach(aID, sA, tA)
	for _, id := range []string{aID, b.GetVolumeId(), r.GetVolumeId()} {
		e.deleteVolume(id)
	}
	e.deleteSnapshot(s1.GetSnapshotId())
	e.assertVolumes()
}

// TestRestoreAndCloneLarger: a restore or clone may be larger than its
// source and gets the requested size (a block volume's loop device shows
// it after stage; a btrfs volume's quota allows it); a smaller one is
// OUT_OF_RANGE; a source of the other access type INVALID_ARGUMENT.
// Nothing is created by a refused request.
func TestRestoreAndCloneLarger(t *testing.T) {
	t.Run("block", func(t *testing.T) {
		e := diskEnv(t)
		a := e.create("a", 4*csitest.Mi, true)
		aID := a.GetVolumeId()
		sA, tA := e.attach(aID, true)
		p := csitest.RandomBytes(21, int(4*csitest.Mi))
		writeDevAt(t, tA, 0, p)
		e.detach(aID, sA, tA)
		snap := e.snapshot("s", aID)
		m := e.create("m", 4*csitest.Mi, false)
		mSnap := e.snapshot("ms", m.GetVolumeId())
		avail := e.available()

		for name, src := range map[string]*csi.VolumeContentSource{"restore": csitest.FromSnapshot(snap.GetSnapshotId()), "clone": csitest.FromVolume(aID)} {
			_, err := e.createReq(&csi.CreateVolumeRequest{Name: name + "-small", CapacityRange: csitest.Range(2*csitest.Mi, 2*csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}, VolumeContentSource: src})
			csitest.CodeIs(t, err, codes.OutOfRange, name+" of a 4Mi block volume into 2Mi")
			_, err = e.createReq(&csi.CreateVolumeRequest{Name: name + "-mnt", CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src})
			csitest.CodeIs(t, err, codes.InvalidArgument, name+" of a block source as a mount volume")
		}
		_, err := e.createReq(&csi.CreateVolumeRequest{Name: "m-as-blk", CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}, VolumeContentSource: csitest.FromSnapshot(mSnap.GetSnapshotId())})
		csitest.CodeIs(t, err, codes.InvalidArgument, "restore of a mount snapshot as a block volume")
		e.assertVolumes(aID, m.GetVolumeId())
		if got := e.available(); got != avail {
			t.Errorf("GetCapacity changed by refused creates: %d, was %d", got, avail)
		}

		for name, src := range map[string]*csi.VolumeContentSource{"restore": csitest.FromSnapshot(snap.GetSnapshotId()), "clone": csitest.FromVolume(aID)} {
			v, err := e.createReq(&csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}, VolumeContentSource: src})
			csitest.MustCode(t, err, codes.OK, name+" into a larger block volume")
			if v.GetCapacityBytes() != 8*csitest.Mi {
				t.Errorf("%s: capacity %d, want 8Mi", name, v.GetCapacityBytes())
			}
			e.assertBacking(v.GetVolumeId(), true, 8*csitest.Mi)
			s, tgt := e.attach(v.GetVolumeId(), true)
			dev := loopOf(t, e.imagePath(v.GetVolumeId()))
			if got := sysfsSize(t, dev); got != 8*csitest.Mi {
				t.Errorf("%s: %s is %d bytes (sysfs), want 8Mi", name, dev, got)
			}
			if got := devSize(t, tgt); got != 8*csitest.Mi {
				t.Errorf("%s: published device is %d bytes (BLKGETSIZE64), want 8Mi", name, got)
			}
			assertBytes(t, name+": first 4Mi", readDev(t, tgt, 0, len(p)), p)
			assertBytes(t, name+": grown 4Mi", readDev(t, tgt, 4*csitest.Mi, int(4*csitest.Mi)), make([]byte, 4*csitest.Mi))
			e.detach(v.GetVolumeId(), s, tgt)
			e.deleteVolume(v.GetVolumeId())
		}
		e.deleteVolume(aID)
		e.deleteVolume(m.GetVolumeId())
		e.deleteSnapshot(snap.GetSnapshotId())
		e.deleteSnapshot(mSnap.GetSnapshotId())
	})
	for _, ec := range mountEngines {
		t.Run(ec.name, func(t *testing.T) {
			e := startEngine(t, ec, nil)
			a := e.create("a", 16*csitest.Mi, false)
			aID := a.GetVolumeId()
			sA, tA := e.attach(aID, false)
			data := csitest.RandomBytes(22, int(10*csitest.Mi))
			mustWrite(t, filepath.Join(tA, "data"), data)
			e.detach(aID, sA, tA)
			snap := e.snapshot("s", aID)
			for name, src := range map[string]*csi.VolumeContentSource{"restore": csitest.FromSnapshot(snap.GetSnapshotId()), "clone": csitest.FromVolume(aID)} {
				_, err := e.createReq(&csi.CreateVolumeRequest{Name: name + "-small", CapacityRange: csitest.Range(8*csitest.Mi, 8*csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src})
				csitest.CodeIs(t, err, codes.OutOfRange, name+" of a 16Mi volume into 8Mi")
				_, err = e.createReq(&csi.CreateVolumeRequest{Name: name + "-blk", CapacityRange: csitest.Range(32*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}, VolumeContentSource: src})
				csitest.CodeIs(t, err, codes.InvalidArgument, name+" of a mount source as a block volume")
			}
			e.assertVolumes(aID)
			for name, src := range map[string]*csi.VolumeContentSource{"restore": csitest.FromSnapshot(snap.GetSnapshotId()), "clone": csitest.FromVolume(aID)} {
				before := e.available()
				v, err := e.createReq(&csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(32*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src})
				csitest.MustCode(t, err, codes.OK, name+" into a larger mount volume")
				if v.GetCapacityBytes() != 32*csitest.Mi {
					t.Errorf("%s: capacity %d, want 32Mi", name, v.GetCapacityBytes())
				}
				if got := e.available(); got != before-32*csitest.Mi {
					t.Errorf("%s: GetCapacity %d after the create, want %d (32Mi taken)", name, got, before-32*csitest.Mi)
				}
				s, tgt := e.attach(v.GetVolumeId(), false)
				assertFile(t, filepath.Join(tgt, "data"), data)
				if ec.engine == "btrfs" {
					// 10Mi + 16Mi = 26Mi: past the source's 16Mi, within 32Mi.
					if err := csitest.WriteSynced(filepath.Join(tgt, "more"), csitest.RandomBytes(23, int(16*csitest.Mi))); err != nil {
						t.Errorf("%s: writing past the source's size into the 32Mi volume: %v", name, err)
					}
					syncfs(t, tgt)
					if err := csitest.WriteSynced(filepath.Join(tgt, "too-much"), csitest.RandomBytes(24, int(10*csitest.Mi))); !isQuotaErr(err) {
						t.Errorf("%s: writing 36Mi into a 32Mi btrfs volume: err = %v, want EDQUOT or ENOSPC", name, err)
					}
				}
				e.detach(v.GetVolumeId(), s, tgt)
				e.deleteVolume(v.GetVolumeId())
			}
			e.deleteVolume(aID)
			e.deleteSnapshot(snap.GetSnapshotId())
		})
	}
}

// TestOnlineExpandBlock: a staged and published block volume is grown with
// ControllerExpandVolume (node expansion required) and NodeExpandVolume.
// The same loop device, held open by a "pod" throughout and never
// detached, reports the new size; the old data is intact and the new range
// writable through the already open descriptor.
func TestOnlineExpandBlock(t *testing.T) {
	e := diskEnv(t)
	a := e.create("a", 8*csitest.Mi, true)
	aID := a.GetVolumeId()
	sA, tA := e.attach(aID, true)
	dev := loopOf(t, e.imagePath(aID))
	p := csitest.RandomBytes(25, int(8*csitest.Mi))
	writeDevAt(t, tA, 0, p)
	fd, err := unix.Open(tA, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	avail := e.available()

	resp, err := e.ctl().ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: aID, CapacityRange: csitest.Range(16*csitest.Mi, 0), VolumeCapability: csitest.BlkCap()})
	csitest.MustCode(t, err, codes.OK, "ControllerExpandVolume to 16Mi")
	if resp.GetCapacityBytes() != 16*csitest.Mi || !resp.GetNodeExpansionRequired() {
		t.Errorf("ControllerExpandVolume: capacity %d, node_expansion_required %v; want 16Mi and true", resp.GetCapacityBytes(), resp.GetNodeExpansionRequired())
	}
	if got := e.available(); got != avail-8*csitest.Mi {
		t.Errorf("GetCapacity after growing by 8Mi: %d, want %d", got, avail-8*csitest.Mi)
	}
	nresp, err := e.node().NodeExpandVolume(csitest.Ctx(t), &csi.NodeExpandVolumeRequest{
		VolumeId: aID, VolumePath: tA, StagingTargetPath: sA, CapacityRange: csitest.Range(16*csitest.Mi, 0), VolumeCapability: csitest.BlkCap(),
	})
	csitest.MustCode(t, err, codes.OK, "NodeExpandVolume")
	if nresp.GetCapacityBytes() != 16*csitest.Mi {
		t.Errorf("NodeExpandVolume: capacity %d, want 16Mi", nresp.GetCapacityBytes())
	}
	if got := loopOf(t, e.imagePath(aID)); got != dev {
		t.Fatalf("after expansion the image is attached to %q, want the same %s", got, dev)
	}
	e.assertPublished(aID, tA, true)
	if got := sysfsSize(t, dev); got != 16*csitest.Mi {
		t.Errorf("%s: %d bytes (sysfs), want 16Mi", dev, got)
	}
	if got := fdSize(t, fd); got != 16*csitest.Mi {
		t.Errorf("descriptor opened before the expansion: BLKGETSIZE64 %d, want 16Mi", got)
	}
	q := csitest.RandomBytes(26, int(csitest.Mi))
	if n, err := unix.Pwrite(fd, q, 12*csitest.Mi); err != nil || n != len(q) {
		t.Fatalf("write at 12Mi through the descriptor opened before the expansion: %d, %v", n, err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatal(err)
	}
	assertBytes(t, "old data after expansion", readDev(t, tA, 0, len(p)), p)
	assertBytes(t, "data written past the old size", readDev(t, tA, 12*csitest.Mi, len(q)), q)
	e.assertBacking(aID, true, 16*csitest.Mi)
	unix.Close(fd)
	fd = -1
	e.detach(aID, sA, tA)
	e.deleteVolume(aID)
}

// TestOnlineExpandBtrfs: a btrfs mount volume is enforced while published
// (writing past its size through the target path fails with EDQUOT or
// ENOSPC), is grown with ControllerExpandVolume and NodeExpandVolume while
// published, and then takes data past the old size but not past the new.
func TestOnlineExpandBtrfs(t *testing.T) {
	e := startEngine(t, mountEngines[1], nil)
	v := e.create("v", 16*csitest.Mi, false)
	id := v.GetVolumeId()
	s, tgt := e.attach(id, false)
	a := csitest.RandomBytes(27, int(12*csitest.Mi))
	mustWrite(t, filepath.Join(tgt, "a"), a)
	syncfs(t, tgt)
	if err := csitest.WriteSynced(filepath.Join(tgt, "b"), csitest.RandomBytes(28, int(8*csitest.Mi))); !isQuotaErr(err) {
		t.Errorf("writing 20Mi into a 16Mi btrfs volume through its target: err = %v, want EDQUOT or ENOSPC", err)
	}
	if err := unix.Unlink(filepath.Join(tgt, "b")); err != nil {
		t.Fatal(err)
	}
	syncfs(t, tgt)

	resp, err := e.ctl().ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(32*csitest.Mi, 0)})
	csitest.MustCode(t, err, codes.OK, "ControllerExpandVolume to 32Mi")
	if resp.GetCapacityBytes() != 32*csitest.Mi {
		t.Errorf("ControllerExpandVolume: capacity %d, want 32Mi", resp.GetCapacityBytes())
	}
	nresp, err := e.node().NodeExpandVolume(csitest.Ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: tgt, StagingTargetPath: s, CapacityRange: csitest.Range(32*csitest.Mi, 0)})
	csitest.MustCode(t, err, codes.OK, "NodeExpandVolume")
	if nresp.GetCapacityBytes() != 32*csitest.Mi {
		t.Errorf("NodeExpandVolume: capacity %d, want 32Mi", nresp.GetCapacityBytes())
	}
	e.assertPublished(id, tgt, false)
	b := csitest.RandomBytes(29, int(12*csitest.Mi))
	if err := csitest.WriteSynced(filepath.Join(tgt, "b"), b); err != nil {
		t.Errorf("writing 24Mi into the volume grown to 32Mi: %v", err)
	}
	syncfs(t, tgt)
	if err := csitest.WriteSynced(filepath.Join(tgt, "c"), csitest.RandomBytes(30, int(12*csitest.Mi))); !isQuotaErr(err) {
		t.Errorf("writing 36Mi into the 32Mi volume: err = %v, want EDQUOT or ENOSPC", err)
	}
	assertFile(t, filepath.Join(tgt, "a"), a)
	assertFile(t, filepath.Join(tgt, "b"), b)
	st, err := e.node().NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: tgt})
	csitest.MustCode(t, err, codes.OK, "NodeGetVolumeStats")
	if u := st.GetUsage(); len(u) == 0 || u[0].GetTotal() != 32*csitest.Mi || u[0].GetUsed() < 24*csitest.Mi {
		t.Errorf("NodeGetVolumeStats: %v, want BYTES total 32Mi, used >= 24Mi", u)
	}
	e.detach(id, s, tgt)
	e.deleteVolume(id)
}
