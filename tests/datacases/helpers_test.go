package datacases

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// env is one running driver and the temp dir holding its sockets and the
// CO's staging and target paths.
type env struct {
	t    *testing.T
	in   *testdriver.Instance
	dir  string
	root string // data root
	seq  atomic.Int64
}

// start runs a driver. fsKind "" puts the data root on the machine's disk,
// else on a fresh testfs filesystem of that kind and size. At the end of the
// test anything the test left mounted under its temp dir, or attached to a
// loop device from the data root, is an error (and is cleaned up).
func start(t *testing.T, fsKind string, fsSize int64, mutate func(*driver.Options)) *env {
	t.Helper()
	testdriver.RequireRoot(t)
	var fsRoot string
	if fsKind != "" {
		fsRoot = testfs.New(t, fsKind, fsSize)
	}
	in := testdriver.Start(t, func(o *driver.Options) {
		if fsRoot != "" {
			o.DataRoot = filepath.Join(fsRoot, "data")
		}
		if mutate != nil {
			mutate(o)
		}
	})
	e := &env{t: t, in: in, dir: in.Dir, root: in.Opts.DataRoot}
	t.Cleanup(e.leftovers)
	return e
}

// restart stops the driver and starts it again with the same options.
func (e *env) restart() {
	e.t.Helper()
	e.in.Stop(e.t)
	dir := e.in.Dir
	e.in = testdriver.StartWith(e.t, e.in.Opts)
	e.in.Dir = dir
}

func (e *env) leftovers() {
	t := e.t
	ms := csitest.MountsUnder(t, e.dir)
	loops := loopDevsUnder(t, e.root)
	if !t.Failed() {
		for _, m := range ms {
			t.Errorf("left mounted after the test: %s", m.Mountpoint)
		}
		for _, l := range loops {
			t.Errorf("loop device left attached after the test: %s", l)
		}
	}
	for i := len(ms) - 1; i >= 0; i-- {
		_ = unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
	}
	for _, l := range loops {
		detachLoop(t, l)
	}
}

func (e *env) ctl() csi.ControllerClient { return e.in.Controller }
func (e *env) node() csi.NodeClient      { return e.in.Node }

func (e *env) volDir(id string) string    { return filepath.Join(e.root, "volumes", id) }
func (e *env) imagePath(id string) string { return filepath.Join(e.root, "block", id+".img") }

// createReq sends CreateVolume and returns the volume or the error.
func (e *env) createReq(req *csi.CreateVolumeRequest) (*csi.Volume, error) {
	resp, err := e.ctl().CreateVolume(csitest.Ctx(e.t), req)
	return resp.GetVolume(), err
}

// create makes a volume of exactly size bytes and checks its backing object.
func (e *env) create(name string, size int64, block bool) *csi.Volume {
	e.t.Helper()
	v, err := e.createReq(&csi.CreateVolumeRequest{
		Name: name, CapacityRange: csitest.Range(size, size), VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
	})
	csitest.MustCode(e.t, err, codes.OK, "CreateVolume "+name)
	if v.GetCapacityBytes() != size {
		e.t.Fatalf("CreateVolume %s: capacity %d, want %d", name, v.GetCapacityBytes(), size)
	}
	e.assertBacking(v.GetVolumeId(), block, size)
	return v
}

// assertBacking checks a volume's backing object: a directory, or an image
// file of exactly size bytes.
func (e *env) assertBacking(id string, block bool, size int64) {
	e.t.Helper()
	if block {
		fi, err := os.Lstat(e.imagePath(id))
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
			e.t.Fatalf("volume %s: image %s: %v (size %v), want a %d-byte file", id, e.imagePath(id), err, fi, size)
		}
		return
	}
	if fi, err := os.Lstat(e.volDir(id)); err != nil || !fi.IsDir() {
		e.t.Fatalf("volume %s: backing directory: %v", id, err)
	}
}

func (e *env) deleteVolume(id string) {
	e.t.Helper()
	_, err := e.ctl().DeleteVolume(csitest.Ctx(e.t), &csi.DeleteVolumeRequest{VolumeId: id})
	csitest.MustCode(e.t, err, codes.OK, "DeleteVolume "+id)
	csitest.AssertGone(e.t, e.volDir(id))
	csitest.AssertGone(e.t, e.imagePath(id))
}

func (e *env) snapshot(name, src string) *csi.Snapshot {
	e.t.Helper()
	resp, err := e.ctl().CreateSnapshot(csitest.Ctx(e.t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
	csitest.MustCode(e.t, err, codes.OK, "CreateSnapshot "+name)
	s := resp.GetSnapshot()
	if !s.GetReadyToUse() || s.GetSourceVolumeId() != src {
		e.t.Fatalf("CreateSnapshot %s: %v, want ready_to_use with source %s", name, s, src)
	}
	return s
}

func (e *env) deleteSnapshot(id string) {
	e.t.Helper()
	_, err := e.ctl().DeleteSnapshot(csitest.Ctx(e.t), &csi.DeleteSnapshotRequest{SnapshotId: id})
	csitest.MustCode(e.t, err, codes.OK, "DeleteSnapshot "+id)
}

func (e *env) available() int64 {
	e.t.Helper()
	resp, err := e.ctl().GetCapacity(csitest.Ctx(e.t), &csi.GetCapacityRequest{})
	csitest.MustCode(e.t, err, codes.OK, "GetCapacity")
	if resp.GetAvailableCapacity() < 0 {
		e.t.Errorf("GetCapacity: available_capacity %d is negative", resp.GetAvailableCapacity())
	}
	return resp.GetAvailableCapacity()
}

// listIDs returns ListVolumes' ids, sorted.
func (e *env) listIDs() []string {
	e.t.Helper()
	resp, err := e.ctl().ListVolumes(csitest.Ctx(e.t), &csi.ListVolumesRequest{})
	csitest.MustCode(e.t, err, codes.OK, "ListVolumes")
	var ids []string
	for _, en := range resp.GetEntries() {
		ids = append(ids, en.GetVolume().GetVolumeId())
	}
	slices.Sort(ids)
	return ids
}

// capacityOf returns the recorded capacity (ControllerGetVolume).
func (e *env) capacityOf(id string) int64 {
	e.t.Helper()
	resp, err := e.ctl().ControllerGetVolume(csitest.Ctx(e.t), &csi.ControllerGetVolumeRequest{VolumeId: id})
	csitest.MustCode(e.t, err, codes.OK, "ControllerGetVolume "+id)
	return resp.GetVolume().GetCapacityBytes()
}

// assertVolumes checks that ListVolumes and the data root's volumes/ and
// block/ directories hold exactly the ids want.
func (e *env) assertVolumes(want ...string) {
	e.t.Helper()
	want = slices.Sorted(slices.Values(want))
	if got := e.listIDs(); !slices.Equal(got, want) {
		e.t.Errorf("ListVolumes = %v, want %v", got, want)
	}
	var onDisk []string
	onDisk = append(onDisk, csitest.DirNames(e.t, filepath.Join(e.root, "volumes"))...)
	for _, n := range csitest.DirNames(e.t, filepath.Join(e.root, "block")) {
		onDisk = append(onDisk, strings.TrimSuffix(n, ".img"))
	}
	slices.Sort(onDisk)
	if !slices.Equal(onDisk, want) {
		e.t.Errorf("data root holds %v, want %v", onDisk, want)
	}
}

// paths returns a fresh staging directory (created) and a fresh target
// path whose parent exists (the target itself is created by the driver).
func (e *env) paths() (staging, target string) {
	n := e.seq.Add(1)
	staging = filepath.Join(e.dir, "staging", fmt.Sprintf("s%d", n))
	target = filepath.Join(e.dir, "pods", fmt.Sprintf("p%d", n), "vol")
	for _, d := range []string{staging, filepath.Dir(target)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			e.t.Fatal(err)
		}
	}
	return staging, target
}

func (e *env) stageReq(id, staging string, block bool) error {
	_, err := e.node().NodeStageVolume(csitest.Ctx(e.t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.CapOf(block),
	})
	return err
}

func (e *env) publishReq(id, staging, target string, block bool) error {
	_, err := e.node().NodePublishVolume(csitest.Ctx(e.t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.CapOf(block),
	})
	return err
}

// attach stages and publishes a volume at fresh paths and checks the
// outcome: a mount volume's target is one bind mount showing its backing
// directory; a block volume's image has a loop device and the target is a
// bind mount of that device node.
func (e *env) attach(id string, block bool) (staging, target string) {
	e.t.Helper()
	staging, target = e.paths()
	csitest.MustCode(e.t, e.stageReq(id, staging, block), codes.OK, "NodeStageVolume "+id)
	csitest.MustCode(e.t, e.publishReq(id, staging, target, block), codes.OK, "NodePublishVolume "+id)
	e.assertPublished(id, target, block)
	return staging, target
}

func (e *env) assertPublished(id, target string, block bool) {
	e.t.Helper()
	if n := len(csitest.MountsAt(e.t, target)); n != 1 {
		e.t.Fatalf("%s: %d mounts, want 1", target, n)
	}
	if block {
		dev := loopOf(e.t, e.imagePath(id))
		if dev == "" {
			e.t.Fatalf("volume %s is published but no loop device has %s as backing file", id, e.imagePath(id))
		}
		var st, dst unix.Stat_t
		if err := unix.Stat(target, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
			e.t.Fatalf("%s: want a block device node (stat: %v, mode %o)", target, err, st.Mode)
		}
		if err := unix.Stat(dev, &dst); err != nil || dst.Rdev != st.Rdev {
			e.t.Fatalf("%s is device %#x, want %s (%#x): %v", target, st.Rdev, dev, dst.Rdev, err)
		}
		return
	}
	if !csitest.SameInode(e.t, target, e.volDir(id)) {
		e.t.Fatalf("%s does not show the backing directory of volume %s", target, id)
	}
}

// detach unpublishes and unstages and checks that nothing is left: no
// mount on either path, the target removed, no loop device for the image.
func (e *env) detach(id, staging, target string) {
	e.t.Helper()
	_, err := e.node().NodeUnpublishVolume(csitest.Ctx(e.t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	csitest.MustCode(e.t, err, codes.OK, "NodeUnpublishVolume "+id)
	_, err = e.node().NodeUnstageVolume(csitest.Ctx(e.t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	csitest.MustCode(e.t, err, codes.OK, "NodeUnstageVolume "+id)
	if n := len(csitest.MountsAt(e.t, target)) + len(csitest.MountsAt(e.t, staging)); n != 0 {
		e.t.Errorf("volume %s: %d mounts left on %s / %s", id, n, target, staging)
	}
	csitest.AssertGone(e.t, target)
	if dev := loopOf(e.t, e.imagePath(id)); dev != "" {
		e.t.Errorf("volume %s: %s still attached after unstage", id, dev)
	}
}

// --- mount table, loop devices, files -----------------------------------

// loopOf is the loop device backed by image, or "".
func loopOf(t testing.TB, image string) string {
	t.Helper()
	want := csitest.RealPath(image)
	var found []string
	for dev, file := range csitest.Loops(t) {
		if file == want {
			found = append(found, dev)
		}
	}
	if len(found) > 1 {
		t.Errorf("%s is attached %d times: %v", image, len(found), found)
	}
	if len(found) == 0 {
		return ""
	}
	return found[0]
}

// loopDevsUnder lists loop devices whose backing file is below dir, sorted.
func loopDevsUnder(t testing.TB, dir string) []string {
	t.Helper()
	return slices.Sorted(maps.Keys(csitest.LoopsBelow(t, dir)))
}

func detachLoop(t testing.TB, dev string) {
	t.Helper()
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Errorf("open %s: %v", dev, err)
		return
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil {
		t.Errorf("detach %s: %v", dev, err)
	}
}

// attachLoop attaches a loop device to image (the test's own, unrelated
// to the driver) and returns it; it is detached when the test ends.
func attachLoop(t testing.TB, image string) string {
	t.Helper()
	file, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(file)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ctl)
	for attempt := 0; attempt < 16; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatal(err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			_ = unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n))))
			fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
		err = unix.IoctlLoopConfigure(fd, &unix.LoopConfig{Fd: uint32(file)})
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { detachLoop(t, dev) })
		return dev
	}
	t.Fatal("no free loop device")
	return ""
}

// devSize is BLKGETSIZE64 of the block device node p.
func devSize(t testing.TB, p string) int64 {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	return fdSize(t, fd)
}

func fdSize(t testing.TB, fd int) int64 {
	t.Helper()
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.BLKGETSIZE64), uintptr(unsafe.Pointer(&size))); e != 0 {
		t.Fatalf("BLKGETSIZE64: %v", e)
	}
	return int64(size)
}

// sysfsSize is /sys/block/loopN/size in bytes.
func sysfsSize(t testing.TB, dev string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "size"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n * 512
}

// writeDevAt writes data at off through the device node p and fsyncs it.
func writeDevAt(t testing.TB, p string, off int64, data []byte) {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if n, err := unix.Pwrite(fd, data, off); err != nil || n != len(data) {
		t.Fatalf("write %d bytes at %d to %s: %d, %v", len(data), off, p, n, err)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Fatalf("fsync %s: %v", p, err)
	}
}

// readDev reads n bytes at off through the device node p, bypassing the
// page cache so the bytes come from the backing image.
func readDev(t testing.TB, p string, off int64, n int) []byte {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_ = unix.IoctlSetInt(fd, unix.BLKFLSBUF, 0) // drop cached pages of the device
	buf := make([]byte, n)
	if k, err := unix.Pread(fd, buf, off); err != nil || k != n {
		t.Fatalf("read %d bytes at %d from %s: %d, %v", n, off, p, k, err)
	}
	return buf
}

func assertBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Errorf("%s: %d bytes differ from the %d expected, first difference at offset %d", what, len(got), len(want), i)
	}
}

func mustWrite(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := csitest.WriteSynced(p, data); err != nil {
		t.Fatalf("write %d bytes to %s: %v", len(data), p, err)
	}
}

func assertFile(t testing.TB, p string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Errorf("read %s: %v", p, err)
		return
	}
	assertBytes(t, p, got, want)
}

// isQuotaErr reports a write refused for lack of space or quota.
func isQuotaErr(err error) bool { return errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC) }

// syncfs commits the filesystem holding p (btrfs accounts qgroups at
// transaction commit).
func syncfs(t testing.TB, p string) {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		t.Fatal(err)
	}
}

// engineCase is a data root configuration for mount volumes.
type engineCase struct {
	name   string
	fs     string // testfs kind, "" = the machine's disk
	engine string
}

var mountEngines = []engineCase{
	{name: "dir", engine: "dir"},
	{name: "btrfs", fs: testfs.Btrfs, engine: "btrfs"},
}

// startEngine runs a driver for ec with --capacity 256Mi, well below the
// free space of the disk or the 1 GiB test filesystem, so GetCapacity is
// exact (capacity - allocated), unless mutate says otherwise.
func startEngine(t *testing.T, ec engineCase, mutate func(*driver.Options)) *env {
	t.Helper()
	return start(t, ec.fs, 1<<30, func(o *driver.Options) {
		o.Engine = contract.Engine(ec.engine)
		o.CapacityBytes = 256 * csitest.Mi
		if mutate != nil {
			mutate(o)
		}
	})
}
