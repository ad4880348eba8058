package block

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A loop device attached through a mount that is gone since (the node
// plugin container that attached it restarted, and its mount namespace
// went) is still found by its image's path, and detached: the kernel then
// names its backing file only by the path below that mount. Without this a
// restarted node plugin left such devices attached for good, holding the
// deleted image and the data root's filesystem.
func TestDevicesFoundAfterTheAttachingMountWent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (loop devices, bind mounts)")
	}
	dataRoot := t.TempDir()
	if err := os.Mkdir(filepath.Join(dataRoot, "block"), 0o755); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(dataRoot, "block", "vol-x.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 4<<20); err != nil {
		t.Fatal(err)
	}
	// The attaching plugin's view: the data root bind-mounted elsewhere.
	view := t.TempDir()
	if err := unix.Mount(dataRoot, view, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	mounted := true
	t.Cleanup(func() {
		if mounted {
			_ = unix.Unmount(view, unix.MNT_DETACH)
		}
	})
	dev, err := Attach(filepath.Join(view, "block", "vol-x.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clearDev(dev, image) })
	if err := unix.Unmount(view, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	mounted = false
	b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file"))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b); got != "/block/vol-x.img\n" {
		t.Fatalf("the kernel names the backing file %q once the mount went, want /block/vol-x.img", got)
	}
	if got, err := Find(image); err != nil || got != dev {
		t.Fatalf("Find(%s) = %q, %v; want %s", image, got, err, dev)
	}
	if n := CountUnder(filepath.Join(dataRoot, "block")); n != 1 {
		t.Fatalf("CountUnder = %d, want 1", n)
	}
	if err := Detach(image); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file")); err == nil {
		t.Fatalf("%s still attached after Detach", dev)
	}
	// A deleted file's device is never taken for a new file of that name.
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if sameFile(image, "/block/vol-x.img (deleted)") {
		t.Fatal("a deleted backing file matched")
	}
}
