package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/tests/testfs"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

// copyFS names a filesystem CopyTree is tested on and whether it shares
// extents (FICLONE).
type copyFS struct {
	name    string
	kind    string // testfs kind, "" = the machine's disk (t.TempDir)
	reflink bool
}

var copyFilesystems = []copyFS{
	{name: "disk", kind: ""},
	{name: "ext4", kind: testfs.Ext4},
	{name: "xfs-reflink", kind: testfs.XFSReflink, reflink: true},
	{name: "btrfs", kind: testfs.Btrfs, reflink: true},
}

// requireRoot fails (never skips) without root: the tests chown, mknod,
// set security.* xattrs and mount.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (chown, mknod, mounts)")
	}
}

// baseDir returns a fresh directory on the filesystem fs.
func baseDir(t *testing.T, fs copyFS) string {
	t.Helper()
	requireRoot(t)
	if fs.kind == "" {
		return t.TempDir()
	}
	// ext4 made below 512 MiB may get 128-byte inodes, which have no room
	// for nanosecond timestamps; 1 GiB (sparse image) avoids that.
	return testfs.New(t, fs.kind, 1<<30)
}

// TestCopyTreeFidelity copies a tree holding every kind of entry and
// attribute and compares source and copy entry by entry: type, mode bits
// (setuid/setgid/sticky), owner, size, content, nanosecond mtime, xattrs
// (user.*, POSIX ACLs, security.capability), symlink targets, device
// numbers, link counts and hard-link groups. Holes must stay holes,
// symlinks must never be followed, and on reflink filesystems data must be
// shared (CopyStats.Cloned > 0).
func TestCopyTreeFidelity(t *testing.T) {
	for _, fs := range copyFilesystems {
		t.Run(fs.name, func(t *testing.T) {
			base := baseDir(t, fs)
			rich := treecmp.BuildRich(t, filepath.Join(base, "src"), filepath.Join(base, "outside"))
			outsideBefore := treecmp.Scan(t, rich.Outside)
			dst := filepath.Join(base, "dst")

			st, err := CopyTree(rich.Root, dst)
			if err != nil {
				t.Fatalf("CopyTree: %v", err)
			}
			src, cp := treecmp.Compare(t, rich.Root, dst, treecmp.Options{})

			// Counters match what was built.
			want := CopyStats{Files: rich.Files, Dirs: rich.Dirs, Symlinks: rich.Symlinks, HardLinks: rich.HardLinks, Specials: rich.Specials}
			got := st
			got.Cloned, got.BytesCopied = 0, 0
			if got != want {
				t.Errorf("CopyStats = %+v, want %+v", got, want)
			}
			if fs.reflink {
				if st.Cloned == 0 {
					t.Errorf("%s: CopyStats.Cloned = 0, want > 0 (FICLONE on a reflink filesystem)", fs.name)
				}
			} else if st.Cloned != 0 || st.BytesCopied < 2*treecmp.MiB {
				t.Errorf("%s: Cloned = %d, BytesCopied = %d; want 0 clones and the data copied", fs.name, st.Cloned, st.BytesCopied)
			}

			// Holes stay holes: 2 MiB of data in a 66 MiB file.
			sp := cp[rich.Sparse]
			if sp.Size != rich.SparseSize {
				t.Errorf("sparse copy: size %d, want %d", sp.Size, rich.SparseSize)
			}
			if alloc := sp.Blocks * 512; alloc > 6*treecmp.MiB {
				t.Errorf("sparse copy: %d bytes allocated for 2 MiB of data (source: %d): holes were filled", alloc, src[rich.Sparse].Blocks*512)
			}
			if alloc := cp["sparse-tail-hole"].Blocks * 512; alloc > 4*treecmp.MiB {
				t.Errorf("sparse-tail-hole copy: %d bytes allocated for 1 MiB of data", alloc)
			}

			// Symlinks are copied as links and never followed: the outside
			// is untouched and its content appears nowhere in the copy.
			assertNoSecret(t, dst, rich.SecretContent)
			if d := treecmp.Diff(outsideBefore, treecmp.Scan(t, rich.Outside), treecmp.Options{}); len(d) > 0 {
				t.Errorf("the directory outside the tree changed: %v", d)
			}
			for _, l := range []string{"sym-abs", "data", "sym-dangling"} {
				if fi, err := os.Lstat(filepath.Join(dst, l)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
					t.Errorf("%s in the copy: want a symlink (lstat: %v, %v)", l, fi, err)
				}
			}

			// The copy is independent of its source (shared extents are
			// copy-on-write).
			f := filepath.Join(dst, "random-1")
			if err := os.WriteFile(f, []byte("changed"), 0o644); err != nil {
				t.Fatal(err)
			}
			if e, err := treecmp.Describe(filepath.Join(rich.Root, "random-1")); err != nil || e.SHA256 != src["random-1"].SHA256 {
				t.Errorf("writing the copy changed the source (%v)", err)
			}
		})
	}
}

// assertNoSecret fails when any regular file below dir holds secret.
func assertNoSecret(t *testing.T, dir string, secret []byte) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, secret) {
			t.Errorf("%s holds the content of a file outside the source tree", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCopyTreeRefusesExistingDestination: dst must not exist, and an
// existing dst is left as it was.
func TestCopyTreeRefusesExistingDestination(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyTree(src, dst); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("CopyTree onto an existing directory: err = %v, want EEXIST", err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CopyTree wrote into the existing destination (%v)", err)
	}
	// A source that is itself a symlink to a directory is refused.
	link := filepath.Join(base, "link")
	if err := os.Symlink(src, link); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyTree(link, filepath.Join(base, "dst2")); !errors.Is(err, unix.ELOOP) && !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("CopyTree of a symlink source: err = %v, want ELOOP", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "dst2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dst2 was created for a refused source")
	}
}

// TestCopyTreeStopsAtMountPoints: a directory below src that is another
// filesystem is copied as an empty directory, never descended into.
func TestCopyTreeStopsAtMountPoints(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	src := filepath.Join(base, "src")
	mnt := filepath.Join(src, "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(mnt, "other-fs"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(base, "dst")
	if _, err := CopyTree(src, dst); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(filepath.Join(dst, "mnt"))
	if err != nil || len(ents) != 0 {
		t.Errorf("mount point in the copy: entries %v (err %v), want an empty directory", ents, err)
	}
}

// TestCopyTreeSymlinkSwapRace swaps, while CopyTree runs over and over, a
// real directory and a symlink to a directory outside the source
// (renameat2 RENAME_EXCHANGE: both names always exist). Whatever each copy
// sees, it must never contain the outside directory's content, and the
// outside must stay untouched: a name that was a symlink when looked at is
// copied as a symlink, one that turns into a symlink between the stat and
// the open makes the copy fail (ELOOP), never follow.
//
// The test only means something when swaps landed inside copies: it
// copies until at least minSwapsInWindow copies were hit mid-walk (refused
// mid-swap, or completed with both names of one type because the swap
// came between them) and fails when that never happens within its budget.
func TestCopyTreeSymlinkSwapRace(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	src, outside := filepath.Join(base, "src"), filepath.Join(base, "outside")
	secret := []byte("OUTSIDE-SECRET-CONTENT")
	buildSwapTrees(t, src, outside, secret)
	outsideBefore := treecmp.Scan(t, outside)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			if err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(src, "sw"), unix.AT_FDCWD, filepath.Join(src, "sw-alt"), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("RENAME_EXCHANGE: %v", err)
				return
			}
		}
	}()
	const (
		minRounds        = 60
		maxRounds        = 5000
		minSwapsInWindow = 5
		budget           = 60 * time.Second
	)
	var sc swapCounts
	start := time.Now()
	for i := 0; i < minRounds || (sc.inWindow() < minSwapsInWindow && i < maxRounds && time.Since(start) < budget); i++ {
		sc.rounds++
		dst := filepath.Join(base, "dst", strconv.Itoa(i))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := CopyTree(src, dst)
		sc.add(t, err, dst, filepath.Join(outside, "odir"))
		assertNoSecret(t, dst, secret)
		if err := os.RemoveAll(dst); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if d := treecmp.Diff(outsideBefore, treecmp.Scan(t, outside), treecmp.Options{}); len(d) > 0 {
		t.Errorf("the directory outside the source changed: %v", d)
	}
	t.Logf("%d copies: %d complete (%d with both names of one type), %d refused mid-swap, %d failed otherwise (first error: %v); entries seen as symlink %d, as directory %d",
		sc.rounds, sc.ok, sc.mixed, sc.refused, sc.otherErr, sc.firstErr, sc.sawLink, sc.sawDir)
	if sc.ok == 0 {
		t.Errorf("no copy completed in %d attempts; a racing rename must not make every copy fail", sc.rounds)
	}
	if sc.inWindow() < minSwapsInWindow {
		t.Fatalf("a swap landed inside a copy only %d times in %d copies (%v), want at least %d: the race this test is about did not happen",
			sc.inWindow(), sc.rounds, time.Since(start).Round(time.Millisecond), minSwapsInWindow)
	}
}

// buildSwapTrees makes src/sw (20 files), outside/odir (20 files holding
// secret) and the symlink src/sw-alt → outside/odir.
func buildSwapTrees(t *testing.T, src, outside string, secret []byte) {
	t.Helper()
	for _, d := range []string{filepath.Join(src, "sw"), filepath.Join(outside, "odir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 20; i++ {
		if err := os.WriteFile(filepath.Join(src, "sw", "inner"+string(rune('a'+i))), []byte("inside"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, "odir", "secret"+string(rune('a'+i))), secret, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(outside, "odir"), filepath.Join(src, "sw-alt")); err != nil {
		t.Fatal(err)
	}
}

// swapCounts tallies what TestCopyTreeSymlinkSwapRace's copies saw.
type swapCounts struct {
	rounds, ok, failed int
	// refused: copies that failed because an entry changed type between
	// its stat and its open or readlink (the swap landed in that window).
	refused, otherErr int
	// mixed: complete copies holding sw and sw-alt as the same type (the
	// swap landed between the two entries of one copy).
	mixed           int
	sawLink, sawDir int
	firstErr        error
}

// inWindow counts the copies a swap demonstrably hit mid-walk.
func (c *swapCounts) inWindow() int { return c.refused + c.mixed }

// add records the outcome of one CopyTree(src, dst) and checks each copied
// name: a symlink keeps the original target, anything else is a directory.
func (c *swapCounts) add(t *testing.T, err error, dst, target string) {
	t.Helper()
	switch {
	case err == nil:
		c.ok++
	case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EINVAL):
		c.failed++
		c.refused++
	default:
		c.failed++
		c.otherErr++
	}
	if err != nil && c.firstErr == nil {
		c.firstErr = err
	}
	var kinds []string
	for _, name := range []string{"sw", "sw-alt"} {
		p := filepath.Join(dst, name)
		fi, lerr := os.Lstat(p)
		switch {
		case lerr != nil:
			// not reached before the error
		case fi.Mode()&os.ModeSymlink != 0:
			c.sawLink++
			kinds = append(kinds, "link")
			if got, _ := os.Readlink(p); got != target {
				t.Errorf("%s: symlink to %q, want the original target", p, got)
			}
		case fi.IsDir():
			c.sawDir++
			kinds = append(kinds, "dir")
		default:
			t.Errorf("%s: unexpected type %v", p, fi.Mode())
		}
	}
	if err == nil && len(kinds) == 2 && kinds[0] == kinds[1] {
		c.mixed++
	}
}
