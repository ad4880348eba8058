package loop

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A loop device attached through a mount that is gone since (the node
// plugin container that attached it restarted, and its mount namespace
// went) is still found by its image's path, counted and detached: the
// kernel then names its backing file only by the path below that mount.
// Without this a restarted node plugin left such devices attached for
// good, holding the deleted image and the data root's filesystem. A
// device whose image was deleted under it is counted, never found.
func TestDevicesFoundAfterTheAttachingMountWent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (loop devices, bind mounts)")
	}
	dataRoot := t.TempDir()
	blockDir := filepath.Join(dataRoot, "block")
	if err := os.Mkdir(blockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(blockDir, "vol-x.img")
	other := filepath.Join(blockDir, "vol-y.img")
	for _, f := range []string{image, other} {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(f, 4<<20); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Only what is still backed by these files: a device number freed
		// here may be someone else's a moment later.
		_ = Detach(image)
		_ = Detach(other)
	})
	dev, otherDev := attachThroughGoneMount(t, dataRoot, "block/vol-x.img"), attachThroughGoneMount(t, dataRoot, "block/vol-y.img")
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
	if n := CountUnder(blockDir); n != 2 {
		t.Fatalf("CountUnder = %d, want 2", n)
	}
	// vol-y.img deleted under its device, and a new file of that name.
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(other); err != nil || got != "" {
		t.Fatalf("Find of a new file named like a deleted one = %q, %v; want none", got, err)
	}
	if n := CountUnder(blockDir); n != 2 {
		t.Fatalf("CountUnder with one image deleted under its device = %d, want 2 (the deleted one still holds space)", n)
	}
	if err := clearIfBacking(otherDev, "/block/vol-y.img (deleted)"); err != nil {
		t.Fatal(err)
	}
	if err := Detach(image); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file")); err == nil {
		t.Fatalf("%s still attached after Detach", dev)
	}
	if n := CountUnder(blockDir); n != 0 {
		t.Fatalf("CountUnder after the detaches = %d, want 0", n)
	}
}

// attachThroughGoneMount attaches a loop device to dataRoot/rel through a
// bind mount of dataRoot made in a private mount namespace of a thread of
// its own, which ends (and the mount with it) when the thread does, as a
// node plugin container's namespace does. It returns the device.
func attachThroughGoneMount(t *testing.T, dataRoot, rel string) string {
	t.Helper()
	type result struct {
		dev string
		err error
	}
	done := make(chan result)
	go func() {
		// Never unlocked: the thread, with its namespace, exits with this
		// goroutine.
		runtime.LockOSThread()
		r := result{}
		defer func() { done <- r }()
		if r.err = unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); r.err != nil {
			return
		}
		if r.err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); r.err != nil {
			return
		}
		view, err := os.MkdirTemp("", "attach-view-")
		if r.err = err; err != nil {
			return
		}
		defer os.Remove(view)
		if r.err = unix.Mount(dataRoot, view, "", unix.MS_BIND, ""); r.err != nil {
			return
		}
		r.dev, r.err = Attach(filepath.Join(view, rel))
		if err := unix.Unmount(view, unix.MNT_DETACH); err != nil && r.err == nil {
			r.err = err
		}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.dev
}

// clearIfBacking detaches dev if its backing file is still named want.
func clearIfBacking(dev, want string) error {
	b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file"))
	if err != nil || string(b) != want+"\n" {
		return nil
	}
	return clearDev(dev, want)
}

// A device another process has open when it is detached (blkid probing
// it, a btrfs device scan) is only marked for detaching by LOOP_CLR_FD; the
// kernel lets go of it at that process's close. Detach waits for that, so
// a DeleteVolume right after NodeUnstageVolume does not find the volume
// still attached while other processes (mkfs, btrfs) probe devices.
func TestDetachWaitsForABriefOpener(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (loop devices)")
	}
	image := filepath.Join(t.TempDir(), "vol-x.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 4<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := Attach(image)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(image) })
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0) // the other opener
	if err != nil {
		t.Fatal(err)
	}
	closing := make(chan struct{}) // closed just before the opener lets go
	go func() {
		time.Sleep(300 * time.Millisecond)
		close(closing)
		unix.Close(fd)
	}()
	if err := Detach(image); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closing:
	default:
		t.Fatal("Detach returned while another process still had the device open")
	}
	if devs, err := Devices(image); err != nil || len(devs) != 0 {
		t.Fatalf("after Detach: %v attached (%v)", devs, err)
	}
}

// Attach uses direct I/O and 4096-byte sectors, read-write and read-only
// alike: the kernel reports LO_FLAGS_DIRECT_IO, a write through the device is in the image
// file at once (read back with O_DIRECT, nothing synced), and data read
// through the device leaves none of the image's pages in the page cache
// (it is cached once, as the device's, not twice).
func TestAttachUsesDirectIO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (loop devices)")
	}
	image := filepath.Join(t.TempDir(), "vol-x.img")
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(image, 8<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := Attach(image)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Detach(image) })
	ro, err := AttachReadOnly(image)
	if err != nil {
		t.Fatal(err)
	}
	devs, err := Devices(image)
	if err != nil || len(devs) != 2 {
		t.Fatalf("Devices: %v, %v; want two", devs, err)
	}
	for _, d := range devs {
		if !d.DirectIO {
			t.Fatalf("%s (read-only %v) runs without direct I/O; is TMPDIR (%s) on a filesystem without O_DIRECT?", d.Path, d.ReadOnly, os.TempDir())
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(d.Path), "queue", "logical_block_size"))
		if err != nil || string(b) != "4096\n" {
			t.Fatalf("%s has logical block size %q (%v), want 4096 on every attach", d.Path, b, err)
		}
	}

	// An O_DIRECT write through the device is in the image when it
	// returns: the device still open, nothing synced or closed.
	data := alignedBuf(t, 1<<20)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	fd, err := unix.Open(dev, unix.O_WRONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, data, 3<<20); err != nil {
		t.Fatal(err)
	}
	if n := residentPages(t, image); n != 0 {
		t.Fatalf("%d pages of the image are in the host's page cache after an O_DIRECT write through the device, want 0 (written to the disk)", n)
	}
	if back := directRead(t, image, 3<<20, len(data)); string(back) != string(data) {
		t.Fatal("the image file lacks an O_DIRECT write through the device once it returned")
	}

	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dev, ro} {
		b, err := os.ReadFile(d)
		if err != nil || len(b) != 8<<20 || string(b[3<<20:4<<20]) != string(data) {
			t.Fatalf("read through %s: %d bytes, %v", d, len(b), err)
		}
	}
	if n := residentPages(t, image); n != 0 {
		t.Errorf("%d pages of the image are in the page cache after reads through its devices, want 0 (cached twice)", n)
	}
}

// directRead reads n bytes of p at off with O_DIRECT (off and n aligned).
func directRead(t *testing.T, p string, off int64, n int) []byte {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := alignedBuf(t, n)
	if _, err := unix.Pread(fd, buf, off); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf...)
}

// alignedBuf is a page-aligned buffer of n bytes, as O_DIRECT wants (an
// anonymous mapping, unmapped when the test ends).
func alignedBuf(t *testing.T, n int) []byte {
	t.Helper()
	buf, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(buf) })
	return buf
}

// residentPages counts the pages of file p in the page cache (mincore of
// a mapping of it, which faults nothing in).
func residentPages(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}
