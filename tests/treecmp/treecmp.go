// Package treecmp describes directory trees file by file and compares two of
// them with full fidelity: file type, permission bits (setuid, setgid and
// sticky included), owner, size, content, nanosecond mtime, extended
// attributes (POSIX ACLs and file capabilities included), symlink targets,
// device numbers and which paths share an inode (hard links). It never
// follows symlinks.
//
// BuildRich makes a source tree that exercises every one of these, for the
// copy, snapshot, restore and clone tests.
package treecmp

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Entry is what Scan records for one path.
type Entry struct {
	Type   string // dir, file, symlink, fifo, char, block, socket
	Perm   uint32 // st_mode & 07777
	UID    uint32
	GID    uint32
	Size   int64  // not for directories (their size is filesystem-specific)
	SHA256 string // regular files
	MtimeN int64  // mtime in nanoseconds since the epoch
	Xattrs map[string]string
	Target string // symlinks
	Rdev   uint64 // device nodes
	Nlink  uint64 // non-directories

	Ino    uint64 // for hard-link groups; never compared directly
	Blocks int64  // st_blocks (512-byte units); never compared directly
}

// Tree maps a path relative to the scanned root ("." for the root) to its
// entry.
type Tree map[string]*Entry

func typeOf(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFREG:
		return "file"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFCHR:
		return "char"
	case unix.S_IFBLK:
		return "block"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("unknown(%o)", mode&unix.S_IFMT)
}

// Scan walks root without following symlinks and describes every entry.
func Scan(t testing.TB, root string) Tree {
	t.Helper()
	tr, err := ScanErr(root)
	if err != nil {
		t.Fatalf("scan %s: %v", root, err)
	}
	return tr
}

// ScanErr is Scan returning its error.
func ScanErr(root string) (Tree, error) {
	tr := Tree{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		e, err := Describe(p)
		if err != nil {
			return err
		}
		tr[rel] = e
		return nil
	})
	return tr, err
}

// Describe describes the single path p (not followed).
func Describe(p string) (*Entry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return nil, err
	}
	e := &Entry{
		Type:   typeOf(st.Mode),
		Perm:   st.Mode & 0o7777,
		UID:    st.Uid,
		GID:    st.Gid,
		MtimeN: st.Mtim.Nano(),
		Ino:    st.Ino,
		Blocks: st.Blocks,
	}
	if e.Type != "dir" {
		e.Size = st.Size
		e.Nlink = uint64(st.Nlink)
	}
	switch e.Type {
	case "file":
		sum, err := hashFile(p)
		if err != nil {
			return nil, err
		}
		e.SHA256 = sum
	case "symlink":
		target, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		e.Target = target
	case "char", "block":
		e.Rdev = st.Rdev
	}
	x, err := Xattrs(p)
	if err != nil {
		return nil, err
	}
	e.Xattrs = x
	return e, nil
}

func hashFile(p string) (string, error) {
	// O_NOFOLLOW: the entry was lstat'ed as a regular file.
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Xattrs returns every extended attribute of p (not followed), name → value.
func Xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("llistxattr %s: %w", p, err)
	}
	if sz == 0 {
		return nil, nil
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil, fmt.Errorf("llistxattr %s: %w", p, err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:sz]), "\x00") {
		// XFS shows its POSIX ACLs to root a second time under these
		// names; the system.posix_acl_* ones are what a copy carries.
		if name == "" || name == "trusted.SGI_ACL_FILE" || name == "trusted.SGI_ACL_DEFAULT" {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			return nil, fmt.Errorf("lgetxattr %s %s: %w", p, name, err)
		}
		val := make([]byte, vsz)
		if vsz > 0 {
			vsz, err = unix.Lgetxattr(p, name, val)
			if err != nil {
				return nil, fmt.Errorf("lgetxattr %s %s: %w", p, name, err)
			}
		}
		out[name] = string(val[:vsz])
	}
	return out, nil
}

// Options tune Diff.
type Options struct {
	// SkipRootAttrs ignores the root directory's own attributes (mode,
	// owner, mtime, xattrs): for comparisons where the root is created by
	// someone else.
	SkipRootAttrs bool
}

// Diff lists every difference between the trees a (source) and b (copy),
// one human-readable line each; empty means equal.
func Diff(a, b Tree, o Options) []string {
	var out []string
	for _, p := range slices.Sorted(maps.Keys(a)) {
		ea := a[p]
		eb, ok := b[p]
		if !ok {
			out = append(out, fmt.Sprintf("%s: missing from the copy (%s)", p, ea.Type))
			continue
		}
		if p == "." && o.SkipRootAttrs {
			continue
		}
		out = append(out, diffEntry(p, ea, eb)...)
	}
	for _, p := range slices.Sorted(maps.Keys(b)) {
		if _, ok := a[p]; !ok {
			out = append(out, fmt.Sprintf("%s: only in the copy (%s)", p, b[p].Type))
		}
	}
	ga, gb := linkGroups(a), linkGroups(b)
	if !slices.Equal(ga, gb) {
		out = append(out, fmt.Sprintf("hard-link groups differ: source %v, copy %v", ga, gb))
	}
	return out
}

func diffEntry(p string, a, b *Entry) []string {
	var out []string
	add := func(what string, x, y any) {
		out = append(out, fmt.Sprintf("%s: %s %v in the source, %v in the copy", p, what, x, y))
	}
	if a.Type != b.Type {
		add("type", a.Type, b.Type)
		return out
	}
	if a.Perm != b.Perm {
		add("mode", fmt.Sprintf("%04o", a.Perm), fmt.Sprintf("%04o", b.Perm))
	}
	if a.UID != b.UID || a.GID != b.GID {
		add("owner", fmt.Sprintf("%d:%d", a.UID, a.GID), fmt.Sprintf("%d:%d", b.UID, b.GID))
	}
	if a.Size != b.Size {
		add("size", a.Size, b.Size)
	}
	if a.SHA256 != b.SHA256 {
		add("content sha256", a.SHA256, b.SHA256)
	}
	if a.MtimeN != b.MtimeN {
		add("mtime (ns)", a.MtimeN, b.MtimeN)
	}
	if a.Target != b.Target {
		add("symlink target", a.Target, b.Target)
	}
	if a.Rdev != b.Rdev {
		add("rdev", fmt.Sprintf("%#x", a.Rdev), fmt.Sprintf("%#x", b.Rdev))
	}
	if a.Nlink != b.Nlink {
		add("link count", a.Nlink, b.Nlink)
	}
	if !maps.Equal(a.Xattrs, b.Xattrs) && (len(a.Xattrs) > 0 || len(b.Xattrs) > 0) {
		add("xattrs", xattrNames(a.Xattrs), xattrNames(b.Xattrs))
	}
	return out
}

func xattrNames(x map[string]string) string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(x)) {
		s = append(s, fmt.Sprintf("%s=%x", k, x[k]))
	}
	return "{" + strings.Join(s, " ") + "}"
}

// linkGroups returns, sorted, the groups of non-directory paths that share
// an inode (only groups of two or more).
func linkGroups(tr Tree) []string {
	byIno := map[uint64][]string{}
	for p, e := range tr {
		if e.Type != "dir" {
			byIno[e.Ino] = append(byIno[e.Ino], p)
		}
	}
	var groups []string
	for _, ps := range byIno {
		if len(ps) > 1 {
			slices.Sort(ps)
			groups = append(groups, strings.Join(ps, "="))
		}
	}
	slices.Sort(groups)
	return groups
}

// Compare scans src and dst and reports every difference with t.Errorf.
// It returns both scans.
func Compare(t testing.TB, src, dst string, o Options) (Tree, Tree) {
	t.Helper()
	a, b := Scan(t, src), Scan(t, dst)
	d := Diff(a, b, o)
	for i, line := range d {
		if i == 40 {
			t.Errorf("%s vs %s: ... and %d more differences", src, dst, len(d)-i)
			break
		}
		t.Errorf("%s vs %s: %s", src, dst, line)
	}
	if len(a) < 2 {
		t.Errorf("%s: scanned only %d entries; the comparison proves nothing", src, len(a))
	}
	return a, b
}
