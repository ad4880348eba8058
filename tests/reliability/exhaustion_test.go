package reliability

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// fullEnv is a driver whose data root runs out of space.
type fullEnv struct {
	t    *testing.T
	in   *testdriver.Instance
	dir  string
	root string
	seq  int
}

func (e *fullEnv) create(name string, size int64, block bool, src *csi.VolumeContentSource) (string, error) {
	req := &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)}, VolumeContentSource: src}
	if size > 0 {
		req.CapacityRange = csitest.Range(size, 0)
	}
	r, err := e.in.Controller.CreateVolume(csitest.Ctx(e.t), req)
	return r.GetVolume().GetVolumeId(), err
}

func (e *fullEnv) mustCreate(name string, size int64, block bool) string {
	e.t.Helper()
	id, err := e.create(name, size, block, nil)
	csitest.MustCode(e.t, err, codes.OK, "CreateVolume "+name)
	return id
}

// attach stages and publishes a volume; it returns the target.
func (e *fullEnv) attach(id string, block bool) (string, string) {
	e.t.Helper()
	e.seq++
	s := csitest.Mkdir(e.t, filepath.Join(e.dir, "s", string(rune('a'+e.seq))))
	tg := filepath.Join(e.dir, "t", string(rune('a'+e.seq)))
	csitest.Mkdir(e.t, filepath.Dir(tg))
	_, err := e.in.Node.NodeStageVolume(csitest.Ctx(e.t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: s, VolumeCapability: csitest.CapOf(block)})
	csitest.MustCode(e.t, err, codes.OK, "NodeStageVolume "+id)
	_, err = e.in.Node.NodePublishVolume(csitest.Ctx(e.t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: s, TargetPath: tg, VolumeCapability: csitest.CapOf(block)})
	csitest.MustCode(e.t, err, codes.OK, "NodePublishVolume "+id)
	return s, tg
}

func (e *fullEnv) detach(id, s, tg string) {
	e.t.Helper()
	_, err := e.in.Node.NodeUnpublishVolume(csitest.Ctx(e.t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg})
	csitest.CodeIs(e.t, err, codes.OK, "NodeUnpublishVolume "+id)
	_, err = e.in.Node.NodeUnstageVolume(csitest.Ctx(e.t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: s})
	csitest.CodeIs(e.t, err, codes.OK, "NodeUnstageVolume "+id)
}

// state is what a failed call must leave as it was: the records, the data
// root's entries, the loop devices of the data root and the capacity.
type fullState struct {
	vols, snaps, disk, loops []string
	available                int64
}

func (e *fullEnv) state() fullState {
	t := e.t
	t.Helper()
	var s fullState
	r, err := e.in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	csitest.MustCode(t, err, codes.OK, "ListVolumes")
	for _, v := range r.GetEntries() {
		s.vols = append(s.vols, v.GetVolume().GetVolumeId()+"="+itoa(v.GetVolume().GetCapacityBytes()))
	}
	sr, err := e.in.Controller.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
	csitest.MustCode(t, err, codes.OK, "ListSnapshots")
	for _, v := range sr.GetEntries() {
		s.snaps = append(s.snaps, v.GetSnapshot().GetSnapshotId())
	}
	for _, d := range []string{"volumes", "block", "snapshots"} {
		for _, n := range csitest.DirNames(t, filepath.Join(e.root, d)) {
			fi, err := os.Lstat(filepath.Join(e.root, d, n))
			if err != nil {
				t.Fatal(err)
			}
			size := int64(0)
			if fi.Mode().IsRegular() {
				size = fi.Size()
			}
			s.disk = append(s.disk, d+"/"+n+"="+itoa(size))
		}
	}
	s.loops = describeLoopsUnder(t, e.root)
	c, err := e.in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
	csitest.MustCode(t, err, codes.OK, "GetCapacity")
	s.available = c.GetAvailableCapacity()
	if s.available < 0 {
		t.Errorf("GetCapacity: %d is negative", s.available)
	}
	return s
}

func (e *fullEnv) assertUnchanged(what string, before fullState) {
	e.t.Helper()
	after := e.state()
	for _, c := range []struct {
		name string
		a, b []string
	}{{"records", before.vols, after.vols}, {"snapshots", before.snaps, after.snaps}, {"data root", before.disk, after.disk}, {"loop devices", before.loops, after.loops}} {
		if !slices.Equal(c.a, c.b) {
			e.t.Errorf("%s: %s changed: %v -> %v", what, c.name, c.a, c.b)
		}
	}
	if after.available != before.available {
		e.t.Errorf("%s: GetCapacity changed: %d -> %d", what, before.available, after.available)
	}
}

func itoa(n int64) string {
	b := []byte{}
	if n == 0 {
		return "0"
	}
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// fillFile writes a file of n bytes (flushed), or as much as fits when n < 0.
func fillFile(t *testing.T, p string, n int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, csitest.Mi)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	for written := int64(0); n < 0 || written < n; {
		chunk := buf
		if n >= 0 && n-written < int64(len(chunk)) {
			chunk = chunk[:n-written]
		}
		m, err := f.Write(chunk)
		written += int64(m)
		if err != nil {
			if n < 0 && errors.Is(err, unix.ENOSPC) {
				break
			}
			t.Fatalf("write %s: %v", p, err)
		}
	}
	if err := f.Sync(); err != nil && !(n < 0 && errors.Is(err, unix.ENOSPC)) {
		t.Fatal(err)
	}
}

// availBytes is the space of the filesystem holding p that an unprivileged
// writer may still use (statfs f_bavail: root's reserved blocks left out).
func availBytes(t *testing.T, p string) int64 {
	t.Helper()
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Bavail) * s.Bsize
}

// TestDataRootFull: the data root (a 64 MiB tmpfs, with --capacity far above
// it so the disk and not the setting runs out) fills up while a snapshot or
// a restore copies data, and before a create or an expansion. Each answers
// RESOURCE_EXHAUSTED and leaves no partial file, no record, no loop device
// and the capacity as it was; once space is freed the same call works. With
// the disk completely full, deletes still work (they are how space comes
// back).
func TestDataRootFull(t *testing.T) {
	fsRoot := testfs.New(t, testfs.Tmpfs, 64*csitest.Mi)
	in := testdriver.Start(t, func(o *driver.Options) {
		o.DataRoot = filepath.Join(fsRoot, "data")
		o.CapacityBytes = 1 << 30
		o.Engine = "dir"
	})
	e := &fullEnv{t: t, in: in, dir: csitest.RealPath(in.Dir), root: csitest.RealPath(in.Opts.DataRoot)}
	t.Cleanup(func() { assertClean(t, e.dir); assertClean(t, e.root) })

	// A mount volume whose pod writes 24 MiB (the dir engine does not cap
	// it at its 1 MiB capacity), and a place for the pod's filler.
	a := e.mustCreate("a", csitest.Mi, false)
	sA, tA := e.attach(a, false)
	fillFile(t, filepath.Join(tA, "big"), 24*csitest.Mi)
	filler := filepath.Join(tA, "filler")

	t.Run("snapshot copy fills the disk", func(t *testing.T) {
		e.t = t
		fillFile(t, filler, availBytes(t, fsRoot)-12*csitest.Mi)
		before := e.state()
		_, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap-a", SourceVolumeId: a})
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateSnapshot of 24 MiB with 12 MiB free")
		e.assertUnchanged("failed CreateSnapshot", before)
		os.Remove(filler)
	})
	var snapA string
	t.Run("restore copy fills the disk", func(t *testing.T) {
		e.t = t
		r, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap-a", SourceVolumeId: a})
		csitest.MustCode(t, err, codes.OK, "CreateSnapshot once there is room")
		snapA = r.GetSnapshot().GetSnapshotId()
		fillFile(t, filler, availBytes(t, fsRoot)-12*csitest.Mi)
		before := e.state()
		_, err = e.create("restored", 0, false, csitest.FromSnapshot(snapA))
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume from a 24 MiB snapshot with 12 MiB free")
		e.assertUnchanged("failed restore", before)
		_, err = e.create("cloned", 0, false, csitest.FromVolume(a))
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume cloned from a 24 MiB volume with 12 MiB free")
		e.assertUnchanged("failed clone", before)
		os.Remove(filler)
		// The snapshot is the one copy left; the retry fits once A's data
		// is gone.
		os.Remove(filepath.Join(tA, "big"))
		id, err := e.create("restored", 0, false, csitest.FromSnapshot(snapA))
		csitest.MustCode(t, err, codes.OK, "restore once there is room")
		if fi, err := os.Stat(filepath.Join(e.root, "volumes", id, "big")); err != nil || fi.Size() != 24*csitest.Mi {
			t.Errorf("the restored volume's data: %v, %v", fi, err)
		}
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.MustCode(t, err, codes.OK, "DeleteVolume restored")
	})
	t.Run("block volumes", func(t *testing.T) {
		e.t = t
		b := e.mustCreate("b", 16*csitest.Mi, true)
		sB, tB := e.attach(b, true)
		// Written end to end: a snapshot copies only what was written.
		if err := writeDevAtZero(tB, append([]byte("block b"), csitest.RandomBytes(1, int(16*csitest.Mi)-7)...)); err != nil {
			t.Fatal(err)
		}
		fillFile(t, filler, availBytes(t, fsRoot)-8*csitest.Mi)
		before := e.state()
		_, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap-b", SourceVolumeId: b})
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateSnapshot of a 16 MiB block volume with 8 MiB free")
		e.assertUnchanged("failed block CreateSnapshot", before)
		_, err = e.create("b2", 16*csitest.Mi, true, nil)
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume of a 16 MiB block volume with 8 MiB free")
		e.assertUnchanged("failed block CreateVolume", before)
		_, err = in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: b, CapacityRange: csitest.Range(32*csitest.Mi, 0)})
		csitest.CodeIs(t, err, codes.ResourceExhausted, "ControllerExpandVolume of a block volume by 16 MiB with 8 MiB free")
		e.assertUnchanged("failed ControllerExpandVolume", before)
		got, err := readAt(tB, 7)
		if err != nil || string(got) != "block b" {
			t.Errorf("block volume after the failed calls: %q, %v", got, err)
		}
		os.Remove(filler)
		r, err := in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: b, CapacityRange: csitest.Range(20*csitest.Mi, 0)})
		if csitest.CodeIs(t, err, codes.OK, "ControllerExpandVolume once there is room") && r.GetCapacityBytes() != 20*csitest.Mi {
			t.Errorf("expanded to %d, want 20 MiB", r.GetCapacityBytes())
		}
		e.detach(b, sB, tB)
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: b})
		csitest.MustCode(t, err, codes.OK, "DeleteVolume b")
	})
	t.Run("completely full: deletes still work", func(t *testing.T) {
		e.t = t
		c := e.mustCreate("c", csitest.Mi, false)
		r, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap-c", SourceVolumeId: c})
		csitest.MustCode(t, err, codes.OK, "CreateSnapshot snap-c")
		fillFile(t, filler, -1)
		if f := availBytes(t, fsRoot); f > 64*csitest.Ki {
			t.Fatalf("the disk still has %d bytes free", f)
		}
		before := e.state()
		_, err = e.create("d", csitest.Mi, false, nil)
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume on a full disk")
		_, err = e.create("d-blk", csitest.Mi, true, nil)
		csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume block on a full disk")
		e.assertUnchanged("failed creates on a full disk", before)
		_, err = in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: r.GetSnapshot().GetSnapshotId()})
		csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot on a full disk")
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: c})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume on a full disk")
		os.Remove(filler)
	})
	e.t = t
	e.detach(a, sA, tA)
	for _, id := range []string{a} {
		_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
	if snapA != "" {
		_, err := in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snapA})
		csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot "+snapA)
	}
	s := e.state()
	if len(s.vols)+len(s.snaps)+len(s.disk)+len(s.loops) != 0 {
		t.Errorf("left after everything was deleted: %+v", s)
	}
}

// TestBlockImagesRunOutMidWrite: the block images live on their own small
// filesystem (an 8 MiB tmpfs mounted at <data root>/block) while the data
// root's own filesystem, which GetCapacity and the capacity check see, has
// plenty: so the disk fills inside the write itself, at fallocate(2), for a
// create, a restore and an expansion. Each answers RESOURCE_EXHAUSTED and
// leaves no image (or, for the expansion, the image, the record and the
// attached loop device at the old size), no record and no loop device.
func TestBlockImagesRunOutMidWrite(t *testing.T) {
	dir := tempDir(t)
	root := filepath.Join(dir, "data")
	csitest.Mkdir(t, filepath.Join(root, "block"))
	if err := unix.Mount("blockfs", filepath.Join(root, "block"), "tmpfs", 0, "size=8m,mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(filepath.Join(root, "block"), 0) })
	in := testdriver.StartWith(t, func() driver.Options {
		o := testdriver.DefaultOptions(dir)
		o.Engine = "dir"
		o.CapacityBytes = 1 << 30
		return o
	}())
	in.Dir = dir
	e := &fullEnv{t: t, in: in, dir: csitest.RealPath(dir), root: csitest.RealPath(root)}
	t.Cleanup(func() {
		ms := csitest.MountsUnder(t, e.dir)
		for _, m := range ms {
			if m.Mountpoint != filepath.Join(e.root, "block") {
				t.Errorf("left mounted: %s", m.Mountpoint)
			}
		}
		if l := describeLoopsUnder(t, e.root); len(l) != 0 {
			t.Errorf("loop devices left: %v", l)
		}
	})

	b := e.mustCreate("b", 4*csitest.Mi, true)
	sB, tB := e.attach(b, true)
	if err := writeDevAtZero(tB, []byte("block b")); err != nil {
		t.Fatal(err)
	}
	snap, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap-b", SourceVolumeId: b})
	csitest.MustCode(t, err, codes.OK, "CreateSnapshot of b (on the data root's own filesystem)")
	before := e.state()
	loopSize := func() int64 {
		l := describeLoopsUnder(t, e.root)
		if len(l) != 1 {
			t.Fatalf("loop devices: %v, want b's", l)
		}
		dev := l[0][:strings.Index(l[0], " <- ")]
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		size, err := unix.IoctlGetInt(fd, unix.BLKGETSIZE64)
		if err != nil {
			t.Fatal(err)
		}
		return int64(size)
	}
	if got := loopSize(); got != 4*csitest.Mi {
		t.Fatalf("b's loop device: %d bytes", got)
	}

	_, err = in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: b, CapacityRange: csitest.Range(16*csitest.Mi, 0)})
	csitest.CodeIs(t, err, codes.ResourceExhausted, "ControllerExpandVolume to 16 MiB on an 8 MiB image filesystem")
	e.assertUnchanged("failed ControllerExpandVolume", before)
	if got := loopSize(); got != 4*csitest.Mi {
		t.Errorf("b's loop device after the failed expansion: %d bytes, want 4 MiB", got)
	}
	_, err = e.create("b2", 6*csitest.Mi, true, nil)
	csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume of 6 MiB with 4 MiB left on the image filesystem")
	e.assertUnchanged("failed CreateVolume", before)
	_, err = e.create("b3", 6*csitest.Mi, true, csitest.FromSnapshot(snap.GetSnapshot().GetSnapshotId()))
	csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume of 6 MiB restored from b's snapshot")
	e.assertUnchanged("failed restore", before)
	got, err := readAt(tB, 7)
	if err != nil || string(got) != "block b" {
		t.Errorf("b after the failed calls: %q, %v", got, err)
	}
	// Retries that fit work.
	id, err := e.create("b3", 0, true, csitest.FromSnapshot(snap.GetSnapshot().GetSnapshotId()))
	csitest.MustCode(t, err, codes.OK, "restore of 4 MiB")
	if img, err := readAt(filepath.Join(e.root, "block", id+".img"), 7); err != nil || string(img) != "block b" {
		t.Errorf("restored image: %q, %v", img, err)
	}
	_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume b3")

	e.detach(b, sB, tB)
	_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: b})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume b")
	_, err = in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	csitest.MustCode(t, err, codes.OK, "DeleteSnapshot")
	if n := csitest.DirNames(t, filepath.Join(e.root, "block")); len(n) != 0 {
		t.Errorf("images left: %v", n)
	}
}
