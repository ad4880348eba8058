package reliability

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// quote prints s with control bytes escaped, for messages.
func quote(s string) string {
	if len(s) > 80 {
		return fmt.Sprintf("%q…(%d bytes)", s[:60], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// writeSyncedWithDir writes data to p and fsyncs it and its directory.
func writeSyncedWithDir(t testing.TB, p string, data []byte) {
	t.Helper()
	if err := writeSyncedWithDirErr(p, data); err != nil {
		t.Fatal(err)
	}
}

func writeSyncedWithDirErr(p string, data []byte) error {
	if err := csitest.WriteSynced(p, data); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(p))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// writeDevAtZero writes data at offset 0 of the block device (or file) p and
// flushes it.
func writeDevAtZero(p string, data []byte) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, data, 0); err != nil {
		return err
	}
	return unix.Fsync(fd)
}

// readAt reads n bytes at offset 0 of p.
func readAt(p string, n int) ([]byte, error) {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, n)
	m, err := unix.Pread(fd, b, 0)
	if err != nil {
		return nil, err
	}
	return b[:m], nil
}

// mayExist reports whether p may exist: true unless lstat says ENOENT, so a
// path that cannot be looked at (EACCES, ELOOP…) counts as existing.
func mayExist(p string) bool {
	_, err := os.Lstat(p)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}

// mountPoints returns the mount points at or below each of dirs, with
// their source identity, for before/after comparisons.
func mountPoints(t testing.TB, dirs ...string) []string {
	t.Helper()
	var out []string
	for _, d := range dirs {
		for _, m := range csitest.MountsUnder(t, d) {
			out = append(out, fmt.Sprintf("%s <- %d:%d%s", m.Mountpoint, m.Major, m.Minor, m.Root))
		}
	}
	slices.Sort(out)
	return out
}

// describeLoopsUnder lists the loop devices whose backing file is below dir, as
// "device <- file".
func describeLoopsUnder(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	for dev, file := range csitest.LoopsBelow(t, dir) {
		out = append(out, dev+" <- "+file)
	}
	slices.Sort(out)
	return out
}

// cleanupMountsAndLoops removes what a failed test left under dir (mounts,
// deepest first, and loop devices backed by files there).
func cleanupMountsAndLoops(t testing.TB, dir string) {
	ms := csitest.MountsUnder(t, dir)
	for i := len(ms) - 1; i >= 0; i-- {
		_ = unix.Unmount(ms[i].Mountpoint, unix.MNT_DETACH)
	}
	for dev := range csitest.LoopsBelow(t, dir) {
		if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			_ = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
			unix.Close(fd)
		}
	}
}

// assertClean fails when anything is mounted under dir or any loop device
// is backed by a file below it, and cleans up so one failure does not leak
// into the next test.
func assertClean(t testing.TB, dir string) {
	t.Helper()
	for _, m := range csitest.MountsUnder(t, dir) {
		t.Errorf("left mounted: %s", m.Mountpoint)
	}
	for _, l := range describeLoopsUnder(t, dir) {
		t.Errorf("loop device left attached: %s", l)
	}
	cleanupMountsAndLoops(t, dir)
}

// loopFS is testfs.New for a test whose CO paths are under dir: the mounts
// and loop devices a failed test leaves (publishes under dir, loop devices
// of images on the new filesystem) are checked and removed before the
// filesystem is unmounted, so a failure never leaves it mounted.
func loopFS(t testing.TB, dir, kind string, size int64) string {
	t.Helper()
	base := testfs.New(t, kind, size)
	t.Cleanup(func() {
		assertClean(t, dir)
		assertClean(t, filepath.Join(base, "data"))
	})
	return base
}

// tempDir is t.TempDir() that is checked, after every later cleanup (the
// driver's stop included), for mounts and loop devices left below it.
func tempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { assertClean(t, dir) })
	return dir
}

// ---- The watcher ----

// node is what the watcher records of one path: enough to see any
// creation, removal or change (inode, type, mode, owner, size, nanosecond
// mtime and ctime, content hash, link target, device number).
type wnode struct {
	Ino, Dev   uint64
	Mode       uint32
	UID, GID   uint32
	Size       int64
	Mtime      int64
	Ctime      int64
	Sum        string
	Link       string
	Rdev       uint64
	MountPoint bool
}

func (n wnode) String() string {
	return fmt.Sprintf("ino=%d mode=%o uid=%d gid=%d size=%d mtime=%d ctime=%d sum=%.12s link=%q rdev=%d",
		n.Ino, n.Mode, n.UID, n.GID, n.Size, n.Mtime, n.Ctime, n.Sum, n.Link, n.Rdev)
}

// watcher snapshots trees the test controls (a stand-in /etc, the temp dir
// holding the CO's paths...) minus the paths a call may legitimately change
// (the data root, the given target), and the mount table and loop devices
// below them.
type watcher struct {
	t     testing.TB
	roots []string
	skip  []string // absolute paths not compared (with everything below)
	// loose paths are compared without their times (the parent of a path
	// a call may create or remove).
	loose []string
}

type wsnap struct {
	nodes  map[string]wnode
	mounts []string
	loops  []string
}

func (w *watcher) skipped(p string) bool {
	for _, s := range w.skip {
		if p == s || strings.HasPrefix(p, s+"/") {
			return true
		}
	}
	return false
}

func (w *watcher) snap() wsnap {
	w.t.Helper()
	s := wsnap{nodes: map[string]wnode{}}
	for _, r := range w.roots {
		err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if w.skipped(p) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			n := wnode{Ino: st.Ino, Dev: st.Dev, Mode: st.Mode, UID: st.Uid, GID: st.Gid, Size: st.Size,
				Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(), Rdev: st.Rdev}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				// Contents are hashed up to 256 KiB; a write to a larger
				// file (a block image) shows in its mtime and ctime.
				if st.Size <= 256<<10 {
					data, err := os.ReadFile(p)
					if err != nil {
						return err
					}
					n.Sum = fmt.Sprintf("%x", sha256.Sum256(data))
				}
			case unix.S_IFLNK:
				n.Link, _ = os.Readlink(p)
			case unix.S_IFDIR:
				n.Size = 0 // directory sizes are filesystem-specific; mtime shows changes
			}
			if slices.Contains(w.loose, p) {
				n.Mtime, n.Ctime = 0, 0
			}
			s.nodes[p] = n
			return nil
		})
		if err != nil {
			w.t.Fatalf("watcher: walk %s: %v", r, err)
		}
	}
	var ms []string
	for _, r := range w.roots {
		for _, m := range csitest.MountsUnder(w.t, r) {
			if !w.skipped(m.Mountpoint) {
				ms = append(ms, fmt.Sprintf("%s <- %d:%d%s %s", m.Mountpoint, m.Major, m.Minor, m.Root, m.Options))
			}
		}
		s.loops = append(s.loops, describeLoopsUnder(w.t, r)...)
	}
	// Mounts on the host's own directories a traversal could aim at.
	for _, p := range []string{"/", "/etc", "/tmp", "/var", "/var/lib", "/root", "/usr"} {
		for _, m := range csitest.MountsAt(w.t, p) {
			ms = append(ms, fmt.Sprintf("%s <- %d:%d%s", m.Mountpoint, m.Major, m.Minor, m.Root))
		}
	}
	slices.Sort(ms)
	s.mounts = ms
	slices.Sort(s.loops)
	return s
}

// diff lists what changed between two snapshots.
func (a wsnap) diff(b wsnap) []string {
	var out []string
	for p, n := range a.nodes {
		m, ok := b.nodes[p]
		switch {
		case !ok:
			out = append(out, "removed: "+p)
		case m != n:
			out = append(out, fmt.Sprintf("changed: %s\n\tbefore %s\n\tafter  %s", p, n, m))
		}
	}
	for p, m := range b.nodes {
		if _, ok := a.nodes[p]; !ok {
			out = append(out, fmt.Sprintf("created: %s (%s)", p, m))
		}
	}
	if !slices.Equal(a.mounts, b.mounts) {
		out = append(out, fmt.Sprintf("mount table changed:\n\tbefore %v\n\tafter  %v", a.mounts, b.mounts))
	}
	if !slices.Equal(a.loops, b.loops) {
		out = append(out, fmt.Sprintf("loop devices changed:\n\tbefore %v\n\tafter  %v", a.loops, b.loops))
	}
	slices.Sort(out)
	return out
}

// assertAvailable checks GetCapacity's available_capacity against the
// configured capacity minus the volumes' sizes. GetCapacity also respects
// the filesystem's free space: on a machine whose disk has less free space
// than the configured capacity, the available figure may only be smaller.
func assertAvailable(t testing.TB, got, capacity, sum int64, root, what string) {
	t.Helper()
	want := capacity - sum
	var s unix.Statfs_t
	if err := unix.Statfs(root, &s); err != nil {
		t.Fatal(err)
	}
	if free := int64(s.Bavail) * s.Bsize; free < want+256<<20 {
		if got > want || got < 0 {
			t.Errorf("%s: GetCapacity %d, want at most %d (the disk has %d bytes free)", what, got, want, free)
		}
		return
	}
	if got != want {
		t.Errorf("%s: GetCapacity %d, want %d (capacity %d minus the volumes' %d bytes)", what, got, want, capacity, sum)
	}
}
