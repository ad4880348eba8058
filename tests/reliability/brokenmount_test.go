package reliability

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// deadFUSE mounts a FUSE filesystem at p (a directory, or a file when file
// is set) served by a child process, then kills that process: what is left
// is the mount of a FUSE server that died, on which every access fails with
// ENOTCONN ("Transport endpoint is not connected"). No FUSE library or
// fusermount is needed: the test opens /dev/fuse and mounts with mount(2),
// as fusermount does.
func deadFUSE(t *testing.T, p string, file bool) {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open /dev/fuse: %v (the kernel's fuse module is needed)", err)
	}
	rootmode := unix.S_IFDIR
	if file {
		rootmode = unix.S_IFREG
	}
	opts := fmt.Sprintf("fd=%d,rootmode=%o,user_id=0,group_id=0", fd, rootmode)
	if err := unix.Mount("deadfuse", p, "fuse.deadfuse", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		unix.Close(fd)
		t.Fatalf("mount fuse on %s: %v", p, err)
	}
	// The server: a process holding the connection's only descriptor.
	f := os.NewFile(uintptr(fd), "/dev/fuse")
	server := exec.Command("sleep", "3600")
	server.ExtraFiles = []*os.File{f}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_ = server.Process.Kill()
	_ = server.Wait()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); !errors.Is(err, unix.ENOTCONN) {
		t.Fatalf("stat of the dead FUSE mount %s: %v, want ENOTCONN", p, err)
	}
}

// TestBrokenMounts: targets and staging paths whose mount is broken (a FUSE
// mount whose server died, alone or stacked on the volume's own mount) or
// that hold several stacked mounts are cleaned up by NodeUnpublishVolume
// and NodeUnstageVolume (every mount gone, the target removed, the data
// intact) and replaced by NodePublishVolume and NodeStageVolume (exactly one
// mount, showing the volume).
func TestBrokenMounts(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.Engine = "dir" })
	dir := csitest.RealPath(in.Dir)
	root := csitest.RealPath(in.Opts.DataRoot)
	t.Cleanup(func() { assertClean(t, dir) })
	n := in.Node

	create := func(name string, block bool) string {
		r, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(4*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)}})
		csitest.MustCode(t, err, codes.OK, "CreateVolume "+name)
		return r.GetVolume().GetVolumeId()
	}
	x := create("broken-x", false)
	b := create("broken-b", true)
	sX := csitest.Mkdir(t, filepath.Join(dir, "sX"))
	sB := csitest.Mkdir(t, filepath.Join(dir, "sB"))
	stage := func(id, s string, block bool) {
		t.Helper()
		_, err := n.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: s, VolumeCapability: csitest.CapOf(block)})
		csitest.MustCode(t, err, codes.OK, "NodeStageVolume "+id)
	}
	publish := func(id, s, tg string, block bool) error {
		_, err := n.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: s, TargetPath: tg, VolumeCapability: csitest.CapOf(block)})
		return err
	}
	unpublish := func(id, tg string) {
		t.Helper()
		_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: tg})
		csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume "+tg)
		if ms := csitest.MountsAt(t, tg); len(ms) != 0 {
			t.Errorf("%s: %d mounts left after NodeUnpublishVolume", tg, len(ms))
		}
		csitest.AssertGone(t, tg)
	}
	showsX := func(tg string) {
		t.Helper()
		if ms := csitest.MountsAt(t, tg); len(ms) != 1 {
			t.Errorf("%s: %d mounts, want exactly 1", tg, len(ms))
		}
		csitest.AssertFileBytes(t, filepath.Join(tg, "data"), []byte("x data"))
	}
	stage(x, sX, false)
	stage(b, sB, true)
	tX := filepath.Join(dir, "tX")
	csitest.MustCode(t, publish(x, sX, tX, false), codes.OK, "NodePublishVolume x")
	writeSyncedWithDir(t, filepath.Join(tX, "data"), []byte("x data"))
	unpublish(x, tX)

	t.Run("dead FUSE mount on a target: unpublish", func(t *testing.T) {
		tg := csitest.Mkdir(t, filepath.Join(dir, "t1"))
		deadFUSE(t, tg, false)
		unpublish(x, tg)
	})
	t.Run("dead FUSE mount on a target: publish replaces it", func(t *testing.T) {
		tg := csitest.Mkdir(t, filepath.Join(dir, "t2"))
		deadFUSE(t, tg, false)
		csitest.MustCode(t, publish(x, sX, tg, false), codes.OK, "NodePublishVolume over a dead FUSE mount")
		showsX(tg)
		unpublish(x, tg)
	})
	t.Run("dead FUSE mount stacked on the volume's publish", func(t *testing.T) {
		tg := filepath.Join(dir, "t3")
		csitest.MustCode(t, publish(x, sX, tg, false), codes.OK, "NodePublishVolume")
		deadFUSE(t, tg, false)
		// Stats and health see a path that does not show the volume.
		_, err := n.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: x, VolumePath: tg})
		csitest.CodeIs(t, err, codes.NotFound, "NodeGetVolumeStats on a dead FUSE mount")
		h, err := n.NodeGetVolumeHealth(csitest.Ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: x, VolumePublishPath: tg})
		if csitest.CodeIs(t, err, codes.OK, "NodeGetVolumeHealth on a dead FUSE mount") && len(h.GetVolumeHealth().GetHealthStatuses()) == 0 {
			t.Errorf("NodeGetVolumeHealth: no problem reported for a publish path hidden by a dead mount")
		}
		// The volume is still mounted underneath: not deletable.
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: x})
		csitest.CodeIs(t, err, codes.FailedPrecondition, "DeleteVolume of a volume published under a dead mount")
		// A repeated publish replaces the dead mount with the volume.
		csitest.MustCode(t, publish(x, sX, tg, false), codes.OK, "NodePublishVolume again")
		showsX(tg)
		deadFUSE(t, tg, false)
		unpublish(x, tg)
	})
	t.Run("stacked mounts on a target", func(t *testing.T) {
		tg := filepath.Join(dir, "t4")
		csitest.MustCode(t, publish(x, sX, tg, false), codes.OK, "NodePublishVolume")
		if err := unix.Mount("stacked", tg, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(sX, tg, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		deadFUSE(t, tg, false)
		if ms := csitest.MountsAt(t, tg); len(ms) != 4 {
			t.Fatalf("%s: %d mounts, want 4 stacked", tg, len(ms))
		}
		unpublish(x, tg)
	})
	t.Run("dead FUSE mount on top of a foreign mount", func(t *testing.T) {
		// Publish removes the dead mount only; the healthy foreign mount
		// under it is not the driver's to remove: ALREADY_EXISTS.
		tg := csitest.Mkdir(t, filepath.Join(dir, "t6"))
		if err := unix.Mount("foreign", tg, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		writeSyncedWithDir(t, filepath.Join(tg, "foreign"), []byte("not ours"))
		deadFUSE(t, tg, false)
		csitest.CodeIs(t, publish(x, sX, tg, false), codes.AlreadyExists, "NodePublishVolume over a dead FUSE mount on a tmpfs")
		if ms := csitest.MountsAt(t, tg); len(ms) != 1 || ms[0].FSType != "tmpfs" {
			t.Errorf("%s: mounts %v, want the foreign tmpfs alone", tg, ms)
		}
		csitest.AssertFileBytes(t, filepath.Join(tg, "foreign"), []byte("not ours"))
		if err := unix.Unmount(tg, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(tg); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("dead FUSE mount on a staging path", func(t *testing.T) {
		s := csitest.Mkdir(t, filepath.Join(dir, "s5"))
		deadFUSE(t, s, false)
		stage(x, s, false)
		if ms := csitest.MountsAt(t, s); len(ms) != 1 {
			t.Errorf("%s: %d mounts after NodeStageVolume, want 1", s, len(ms))
		}
		csitest.AssertFileBytes(t, filepath.Join(s, "data"), []byte("x data"))
		deadFUSE(t, s, false)
		_, err := n.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: x, StagingTargetPath: s})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume under a dead FUSE mount")
		if ms := csitest.MountsAt(t, s); len(ms) != 0 {
			t.Errorf("%s: %d mounts left after NodeUnstageVolume", s, len(ms))
		}
	})
	t.Run("dead FUSE mount on a block volume's device file", func(t *testing.T) {
		tg := filepath.Join(dir, "tb")
		csitest.MustCode(t, publish(b, sB, tg, true), codes.OK, "NodePublishVolume block")
		if err := writeDevAtZero(tg, []byte("block data")); err != nil {
			t.Fatal(err)
		}
		deadFUSE(t, tg, true)
		csitest.MustCode(t, publish(b, sB, tg, true), codes.OK, "NodePublishVolume block over a dead FUSE mount")
		if ms := csitest.MountsAt(t, tg); len(ms) != 1 {
			t.Errorf("%s: %d mounts, want 1", tg, len(ms))
		}
		got, err := readAt(tg, 10)
		if err != nil || string(got) != "block data" {
			t.Errorf("block volume through its republished device: %q, %v", got, err)
		}
		deadFUSE(t, tg, true)
		unpublish(b, tg)
	})

	for _, v := range []struct {
		id, s string
	}{{x, sX}, {b, sB}} {
		_, err := n.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.s})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume "+v.id)
	}
	csitest.AssertFileBytes(t, filepath.Join(root, "volumes", x, "data"), []byte("x data"))
	for _, id := range []string{x, b} {
		_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
}
