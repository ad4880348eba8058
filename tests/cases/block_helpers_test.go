package cases

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// Helpers for the cases on raw block volumes (C35, C36, C39 and the block
// rows of C38, C50): a block volume is an image file
// <data root>/block/<id>.img; NodeStageVolume attaches a loop device to it
// and makes a device node of it at <staging path>/<volume_id>;
// NodePublishVolume bind-mounts a loop device node onto a file at the
// target path.

// createBlock creates a block volume of exactly size bytes and checks its
// image file.
func createBlock(t testing.TB, in *testdriver.Instance, name string, size int64) string {
	t.Helper()
	resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: csitest.Range(size, size), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()},
	})
	csitest.MustCode(t, err, codes.OK, "CreateVolume "+name+" (block)")
	id := resp.GetVolume().GetVolumeId()
	if fi, err := os.Stat(blockImage(in, id)); err != nil || fi.Size() != size {
		t.Fatalf("CreateVolume %s: image of %s: %v (want %d bytes)", name, id, err, size)
	}
	// A test that stops early must not leave loop devices behind for the
	// next one: at the end, any still attached to the image is an error
	// (when the test has not failed yet) and is detached.
	img := csitest.RealPath(blockImage(in, id))
	t.Cleanup(func() {
		for dev, file := range csitest.Loops(t) {
			if strings.TrimSuffix(file, " (deleted)") != img {
				continue
			}
			if !t.Failed() {
				t.Errorf("loop device %s still attached to %s at the end of the test", dev, img)
			}
			if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				_ = unix.Close(fd)
			}
		}
	})
	return id
}

// blockImage is the documented image file of a block volume.
func blockImage(in *testdriver.Instance, id string) string {
	return filepath.Join(in.Opts.DataRoot, "block", id+".img")
}

// loopDev is one loop device attached to an image.
type loopDev struct {
	dev string
	ro  bool // /sys/block/loopN/ro: the kernel refuses writes to the device
}

// blockLoops returns the loop devices whose backing file is volume id's
// image (/sys/block/loop*/loop/backing_file), with their read-only flag.
func blockLoops(t testing.TB, in *testdriver.Instance, id string) []loopDev {
	t.Helper()
	img := csitest.RealPath(blockImage(in, id))
	var out []loopDev
	for dev, file := range csitest.Loops(t) {
		if file != img {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "ro"))
		if err != nil {
			t.Fatalf("read-only flag of %s: %v", dev, err)
		}
		out = append(out, loopDev{dev: dev, ro: strings.TrimSpace(string(b)) == "1"})
	}
	return out
}

// loopOfMode returns the read-write (ro false) or read-only loop device of
// volume id's image; it fails the test unless there is exactly one.
func loopOfMode(t testing.TB, in *testdriver.Instance, id string, ro bool) string {
	t.Helper()
	var found []string
	for _, l := range blockLoops(t, in, id) {
		if l.ro == ro {
			found = append(found, l.dev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("volume %s: %d loop devices with read-only=%v (%v), want 1", id, len(found), ro, blockLoops(t, in, id))
	}
	return found[0]
}

// assertLoops checks how many read-write and read-only loop devices are
// attached to volume id's image.
func assertLoops(t testing.TB, in *testdriver.Instance, id string, rw, ro int) {
	t.Helper()
	var gotRW, gotRO int
	// A detach (LOOP_CLR_FD) while another process has the device open
	// (a loop device scan of a test running in parallel) is carried out by
	// the kernel at that process's close: allow it a moment.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		gotRW, gotRO = 0, 0
		for _, l := range blockLoops(t, in, id) {
			if l.ro {
				gotRO++
			} else {
				gotRW++
			}
		}
		if (gotRW == rw && gotRO == ro) || time.Now().After(deadline) {
			break
		}
	}
	if gotRW != rw || gotRO != ro {
		t.Errorf("volume %s: %d read-write and %d read-only loop devices attached (%v), want %d and %d",
			id, gotRW, gotRO, blockLoops(t, in, id), rw, ro)
	}
}

// stageBlock runs NodeStageVolume with blk at staging (created first, as
// kubelet does) and checks that a read-write loop device is attached.
func stageBlock(t testing.TB, in *testdriver.Instance, id, staging string) {
	t.Helper()
	csitest.Mkdir(t, staging)
	_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.BlkCap(),
	})
	csitest.MustCode(t, err, codes.OK, "NodeStageVolume "+id+" (block)")
	rw := loopOfMode(t, in, id, false)
	// The staging directory holds a device node of the loop device, named
	// after the volume; nothing is mounted.
	if node := filepath.Join(staging, id); rdevOf(t, node) != rdevOf(t, rw) {
		t.Errorf("%s is not a node of %s", node, rw)
	}
	if ms := csitest.MountsUnder(t, staging); len(ms) != 0 {
		t.Errorf("%s: %d mount(s) after a block stage, want none", staging, len(ms))
	}
}

func publishBlockReq(id, staging, target string, readonly bool) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.BlkCap(), Readonly: readonly,
	}
}

// assertDeviceAt checks that p is a single mount holding the block device
// node dev, read-only in the mount table when ro.
func assertDeviceAt(t testing.TB, p, dev string, ro bool) {
	t.Helper()
	ms := csitest.MountsAt(t, p)
	if len(ms) != 1 {
		t.Errorf("%s: %d mounts, want exactly 1 (a bind mount of %s)", p, len(ms), dev)
		return
	}
	if got := rdevOf(t, p); got != rdevOf(t, dev) {
		t.Errorf("%s holds device %#x, want %s (%#x)", p, got, dev, rdevOf(t, dev))
	}
	opts := strings.Split(ms[0].Options, ",")
	want := "rw"
	if ro {
		want = "ro"
	}
	if opts[0] != want {
		t.Errorf("%s: mount options %v, want %s", p, opts, want)
	}
}

// rdevOf is the device number of the block device node p.
func rdevOf(t testing.TB, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		t.Fatalf("%s is not a block device node (mode %o)", p, st.Mode)
	}
	return st.Rdev
}

// blkROGet is the device's read-only flag as the kernel reports it
// (ioctl BLKROGET on p).
func blkROGet(t testing.TB, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", p, err)
	}
	defer unix.Close(fd)
	v, err := unix.IoctlGetInt(fd, unix.BLKROGET)
	if err != nil {
		t.Fatalf("BLKROGET %s: %v", p, err)
	}
	return v
}

// readDevice reads n bytes at off from the device node p (a fresh open, so
// nothing cached by an earlier open of the device is read back).
func readDevice(t testing.TB, p string, off int64, n int) []byte {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s for reading: %v", p, err)
	}
	defer unix.Close(fd)
	b := make([]byte, n)
	if got, err := unix.Pread(fd, b, off); err != nil || got != n {
		t.Fatalf("read %d bytes at %d from %s: %d, %v", n, off, p, got, err)
	}
	return b
}

// writeDevice writes data at off to the device node p and fsyncs it. It
// returns the first error of open, write or fsync.
func writeDevice(p string, off int64, data []byte) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	n, err := unix.Pwrite(fd, data, off)
	if err == nil && n != len(data) {
		err = errors.New("short write")
	}
	if err != nil {
		return err
	}
	return unix.Fsync(fd)
}

// unstageBlock runs NodeUnstageVolume and checks that nothing of the stage
// is left: no mount on or in the staging directory, nothing the driver put
// in it (the device node), and no loop device attached to the image.
func unstageBlock(t testing.TB, in *testdriver.Instance, id, staging string) {
	t.Helper()
	_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume "+id+" at "+staging)
	if ms := csitest.MountsUnder(t, staging); len(ms) != 0 {
		t.Errorf("%s: %d mount(s) at or below it after unstage", staging, len(ms))
	}
	if names := csitest.DirNames(t, staging); len(names) != 0 {
		t.Errorf("%s holds %v after unstage, want it empty", staging, names)
	}
	assertLoops(t, in, id, 0, 0)
}
