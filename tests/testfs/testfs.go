// Package testfs makes real, loop-backed filesystems for tests: an image
// file in t.TempDir(), a loop device, mkfs, a mount. Everything is unmounted,
// detached and removed when the test ends.
package testfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Kinds of filesystem New can make.
const (
	Btrfs      = "btrfs"       // mkfs.btrfs, quotas (qgroups) enabled
	XFSReflink = "xfs-reflink" // mkfs.xfs -m reflink=1
	Ext4       = "ext4"
	Ext4Crypt  = "ext4-encrypt" // mkfs.ext4 -O encrypt: fscrypt works on it
	Tmpfs      = "tmpfs"        // no loop device; size-limited tmpfs
)

// New mounts a fresh filesystem of the given kind and size (bytes) and
// returns its mount point. Fails the test (never skips) when a tool is
// missing: .ci/run installs btrfs-progs and xfsprogs.
func New(t testing.TB, kind string, size int64) string {
	t.Helper()
	return newFS(t, kind, size, false)
}

// NewDirect is New with the loop device doing direct I/O to its image
// (losetup --direct-io=on): the filesystem's blocks are cached once and
// its O_DIRECT and flushes reach the disk, as on a real disk; for the I/O
// benchmarks, where a buffered loop device would measure the page cache.
func NewDirect(t testing.TB, kind string, size int64) string {
	t.Helper()
	return newFS(t, kind, size, true)
}

func newFS(t testing.TB, kind string, size int64, direct bool) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("testfs needs root")
	}
	dir := t.TempDir()
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if kind == Tmpfs {
		run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "testfs", mnt)
		t.Cleanup(func() { run(t, "umount", mnt) })
		return mnt
	}
	img := filepath.Join(dir, "fs.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	switch kind {
	case Btrfs:
		run(t, "mkfs.btrfs", "-q", "-f", img)
	case XFSReflink:
		run(t, "mkfs.xfs", "-q", "-f", "-m", "reflink=1", img)
	case Ext4:
		run(t, "mkfs.ext4", "-q", "-F", img)
	case Ext4Crypt:
		run(t, "mkfs.ext4", "-q", "-F", "-O", "encrypt", img)
	default:
		t.Fatalf("unknown filesystem kind %q", kind)
	}
	losetup := []string{"--find", "--show", img}
	if direct {
		losetup = append(losetup, "--direct-io=on")
	}
	dev := strings.TrimSpace(run(t, "losetup", losetup...))
	t.Cleanup(func() { run(t, "losetup", "-d", dev) })
	run(t, "mount", dev, mnt)
	t.Cleanup(func() { run(t, "umount", mnt) })
	if kind == Btrfs {
		run(t, "btrfs", "quota", "enable", mnt)
	}
	return mnt
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Sync commits the filesystem holding p (syncfs(2) through sync -f): on
// btrfs, qgroup counters move at the commit.
func Sync(t testing.TB, p string) {
	t.Helper()
	run(t, "sync", "-f", p)
}
