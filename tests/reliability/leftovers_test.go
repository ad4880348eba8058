package reliability

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// Start-up recovery never keeps the driver from serving because of a
// leftover. Before, a kill during CreateSnapshot on btrfs left a read-only
// snapshot subvolume without a record; btrfs refuses to move a read-only
// subvolume into another directory, so every later start failed ("move
// unclaimed … aside: read-only file system") and the node crash-looped
// until someone deleted it by hand.
//
// Here, on btrfs: a volume (writable subvolume) and a snapshot (read-only
// subvolume) that no record claims — the state file is put back to a copy
// taken before they were made, as restoring a backup does — must be moved
// to orphaned/, the snapshot still read-only and both with their bytes; and
// the data of an interrupted create that cannot be removed (an immutable
// file inside it) must be left in place, logged, and counted in the
// localdir_recovery_leftovers metric, while the driver starts and serves.
func TestRecoveryLeftovers(t *testing.T) {
	dir := tempDir(t)
	root := filepath.Join(loopFS(t, dir, testfs.Btrfs, 1<<30), "data")
	addr := freeAddr(t)
	args := []string{"--data-root=" + root, "--engine=btrfs", "--metrics-address=" + addr}

	p := startProc(t, dir, args...)
	stateCopy, err := os.ReadFile(filepath.Join(root, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := p.controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "v", CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.MustCode(t, err, codes.OK, "CreateVolume")
	vid := resp.GetVolume().GetVolumeId()
	writeSyncedWithDir(t, filepath.Join(root, "volumes", vid, "f"), []byte("volume bytes"))
	sresp, err := p.controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: vid})
	csitest.MustCode(t, err, codes.OK, "CreateSnapshot")
	sid := sresp.GetSnapshot().GetSnapshotId()
	p.stop(t)

	// The state file of before the volume and the snapshot.
	if err := os.WriteFile(filepath.Join(root, "state.db"), stateCopy, 0o600); err != nil {
		t.Fatal(err)
	}
	// An interrupted create's data with an immutable file in it.
	stuck := filepath.Join(root, "volumes", ".creating-vol-0123456789abcdef0123456789abcdef")
	if err := os.MkdirAll(stuck, 0o700); err != nil {
		t.Fatal(err)
	}
	immutable := filepath.Join(stuck, "f")
	writeSyncedWithDir(t, immutable, []byte("x"))
	setImmutable(t, immutable, true)
	t.Cleanup(func() { setImmutable(t, immutable, false) })

	p = startProc(t, dir, args...) // fails the test if it does not start
	defer p.stop(t)
	for _, c := range []struct{ path, file, want string }{
		{filepath.Join(root, "orphaned", vid), "f", "volume bytes"},
		{filepath.Join(root, "orphaned", sid), "f", "volume bytes"},
	} {
		if got, err := os.ReadFile(filepath.Join(c.path, c.file)); err != nil || string(got) != c.want {
			t.Errorf("%s: %q %v, want %q", c.path, got, err, c.want)
		}
	}
	if ro := subvolReadOnly(t, filepath.Join(root, "orphaned", sid)); !ro {
		t.Errorf("the snapshot moved to orphaned/ is no longer read-only")
	}
	if ro := subvolReadOnly(t, filepath.Join(root, "orphaned", vid)); ro {
		t.Errorf("the volume moved to orphaned/ became read-only")
	}
	for _, d := range []string{"volumes", "snapshots"} {
		for _, n := range csitest.DirNames(t, filepath.Join(root, d)) {
			if d != "volumes" || n != filepath.Base(stuck) {
				t.Errorf("%s/%s still there", d, n)
			}
		}
	}
	if _, err := os.Stat(immutable); err != nil {
		t.Errorf("the leftover that could not be removed is gone: %v", err)
	}
	if got := metricValue(t, addr, `localdir_recovery_leftovers{node="n1"}`); got != "1" {
		t.Errorf("localdir_recovery_leftovers = %q, want 1", got)
	}
	if !strings.Contains(p.Output.String(), filepath.Base(stuck)) {
		t.Errorf("the log does not name the leftover %s", stuck)
	}
	// It serves: a create, its snapshot and a restore.
	resp, err = p.controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "after", CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.MustCode(t, err, codes.OK, "CreateVolume after the start")
	sresp, err = p.controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "s2", SourceVolumeId: resp.GetVolume().GetVolumeId()})
	csitest.MustCode(t, err, codes.OK, "CreateSnapshot after the start")
	_, err = p.controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "r", CapacityRange: csitest.Range(8*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
		VolumeContentSource: csitest.FromSnapshot(sresp.GetSnapshot().GetSnapshotId())})
	csitest.MustCode(t, err, codes.OK, "restore after the start")
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metricValue returns the text value of one sample of /metrics ("" when
// absent), polling briefly while the server starts.
func metricValue(t *testing.T, addr, sample string) string {
	t.Helper()
	for i := 0; i < 50; i++ {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, l := range strings.Split(string(body), "\n") {
				if v, ok := strings.CutPrefix(l, sample+" "); ok {
					return v
				}
			}
			return ""
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no /metrics on %s", addr)
	return ""
}

// setImmutable sets or clears FS_IMMUTABLE_FL (chattr +i) on p.
func setImmutable(t *testing.T, p string, on bool) {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if !on && os.IsNotExist(err) {
			return
		}
		t.Fatal(err)
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		t.Fatal(err)
	}
	if on {
		flags |= fsImmutableFL
	} else {
		flags &^= fsImmutableFL
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(flags)); err != nil {
		t.Fatal(err)
	}
}

// subvolReadOnly reads a subvolume's ro property with btrfs-progs.
func subvolReadOnly(t *testing.T, p string) bool {
	t.Helper()
	out, err := exec.Command("btrfs", "property", "get", "-ts", p, "ro").CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs property get %s: %v: %s", p, err, out)
	}
	return strings.TrimSpace(string(out)) == "ro=true"
}

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h.
const fsImmutableFL = 0x00000010
