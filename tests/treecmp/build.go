package treecmp

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// MiB is 1 << 20 bytes.
const MiB = 1 << 20

// Rich describes what BuildRich made.
type Rich struct {
	Root    string // the tree
	Outside string // a directory beside it that absolute symlinks point into

	// SecretFile is the file outside the tree that SymlinkAbs points to;
	// SecretContent its content, which must never appear inside a copy.
	SecretFile    string
	SecretContent []byte

	// Sparse is the path (relative to Root) of a file of SparseSize bytes
	// with 2 MiB of data around a 64 MiB hole.
	Sparse     string
	SparseSize int64

	// Expected CopyTree counters for this tree.
	Files, Dirs, Symlinks, HardLinks, Specials int
}

// Owner used for the files BuildRich chowns.
const (
	UID = 1234
	GID = 5678
)

// RandomBytes returns n reproducible pseudo-random bytes for a seed (ChaCha8
// keyed by it). csitest.RandomBytes is this function: one seed gives the
// same bytes through either package.
func RandomBytes(seed uint64, n int) []byte {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	key[31] = 0x5a
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// POSIX ACL xattr encoding (linux/posix_acl_xattr.h): a little-endian
// header {u32 version=2} and entries {u16 tag, u16 perm, u32 id}, sorted by
// tag then id.
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclNoID     = 0xffffffff
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// ACL encodes a system.posix_acl_* value.
func ACL(entries ...aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// sampleACL is u::rw-,u:1000:r--,g::r--,g:2000:rw-,m::rw-,o::---.
func sampleACL() []byte {
	return ACL(
		aclEntry{aclUserObj, 6, aclNoID},
		aclEntry{aclUser, 4, 1000},
		aclEntry{aclGroupObj, 4, aclNoID},
		aclEntry{aclGroup, 6, 2000},
		aclEntry{aclMask, 6, aclNoID},
		aclEntry{aclOther, 0, aclNoID},
	)
}

// capNetBindService is a security.capability value (struct vfs_cap_data,
// revision 2): cap_net_bind_service=ep.
func capNetBindService() []byte {
	b := binary.LittleEndian.AppendUint32(nil, 0x02000000|1) // VFS_CAP_REVISION_2 | effective
	b = binary.LittleEndian.AppendUint32(b, 1<<10)           // permitted[0]: CAP_NET_BIND_SERVICE
	b = binary.LittleEndian.AppendUint32(b, 0)               // inheritable[0]
	b = binary.LittleEndian.AppendUint32(b, 0)               // permitted[1]
	return binary.LittleEndian.AppendUint32(b, 0)            // inheritable[1]
}

// BuildRich creates at root (which must not exist) a tree with every kind
// of entry and attribute a full-fidelity copy must keep, and beside it, in
// outside (created), the targets of its absolute symlinks. Every entry gets
// its own nanosecond mtime. Needs root.
func BuildRich(t testing.TB, root, outside string) *Rich {
	t.Helper()
	r := &Rich{Root: root, Outside: outside, Sparse: "sparse", SparseSize: 66 * MiB}
	must := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("build tree: %s: %v", what, err)
		}
	}
	p := func(rel string) string { return filepath.Join(root, rel) }
	mkdir := func(rel string, perm uint32) {
		t.Helper()
		must(unix.Mkdir(p(rel), 0o700), "mkdir "+rel)
		must(unix.Chmod(p(rel), perm), "chmod "+rel)
		r.Dirs++
	}
	write := func(rel string, data []byte, perm uint32) {
		t.Helper()
		must(os.WriteFile(p(rel), data, 0o600), "write "+rel)
		must(unix.Chmod(p(rel), perm), "chmod "+rel)
		r.Files++
	}
	link := func(old, rel string) {
		t.Helper()
		must(unix.Linkat(unix.AT_FDCWD, p(old), unix.AT_FDCWD, p(rel), 0), "link "+rel)
		r.HardLinks++
	}
	symlink := func(target, rel string) {
		t.Helper()
		must(unix.Symlink(target, p(rel)), "symlink "+rel)
		r.Symlinks++
	}
	mknod := func(rel string, mode uint32, dev int) {
		t.Helper()
		must(unix.Mknod(p(rel), mode, dev), "mknod "+rel)
		r.Specials++
	}
	setx := func(rel, name string, val []byte) {
		t.Helper()
		must(unix.Lsetxattr(p(rel), name, val, 0), "setxattr "+name+" on "+rel)
	}

	// Outside the tree: what absolute symlinks point at.
	must(os.MkdirAll(filepath.Join(outside, "odir"), 0o755), "mkdir outside")
	r.SecretFile = filepath.Join(outside, "secret")
	r.SecretContent = []byte("OUTSIDE-SECRET " + strings.Repeat("s", 100))
	must(os.WriteFile(r.SecretFile, r.SecretContent, 0o644), "write secret")
	must(os.WriteFile(filepath.Join(outside, "odir", "secret-in-dir"), r.SecretContent, 0o644), "write secret-in-dir")

	must(unix.Mkdir(root, 0o755), "mkdir root")
	r.Dirs++

	// Regular files with random data, odd sizes, an empty one.
	write("small.txt", []byte("hello\n"), 0o644)
	write("empty", nil, 0o600)
	write("random-1", RandomBytes(1, 300<<10), 0o644)
	write("random-2", RandomBytes(2, 3*MiB+17), 0o640)
	write("name with spaces & ünïcode", RandomBytes(3, 4097), 0o644)
	write(strings.Repeat("L", 255), []byte("long name"), 0o644)

	// Sparse: 1 MiB data, 64 MiB hole, 1 MiB data; and one ending in a hole.
	f, err := os.OpenFile(p("sparse"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	must(err, "create sparse")
	_, err = f.WriteAt(RandomBytes(4, MiB), 0)
	must(err, "write sparse head")
	_, err = f.WriteAt(RandomBytes(5, MiB), 65*MiB)
	must(err, "write sparse tail")
	must(f.Close(), "close sparse")
	r.Files++
	f, err = os.OpenFile(p("sparse-tail-hole"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	must(err, "create sparse-tail-hole")
	_, err = f.WriteAt(RandomBytes(6, MiB), 0)
	must(err, "write sparse-tail-hole")
	must(f.Truncate(16*MiB), "truncate sparse-tail-hole")
	must(f.Close(), "close sparse-tail-hole")
	r.Files++

	// Hard links: three names for one file across directories.
	mkdir("sub", 0o755)
	write("hl-a", RandomBytes(7, 64<<10), 0o644)
	link("hl-a", "sub/hl-b")

	// Symlinks: absolute to outside, to a directory outside (named like a
	// directory), relative, relative upwards, dangling, and a hard-linked
	// symlink.
	symlink(r.SecretFile, "sym-abs")
	symlink(filepath.Join(outside, "odir"), "data")
	symlink("random-1", "sym-rel")
	symlink("../small.txt", "sub/sym-up")
	symlink("does/not/exist", "sym-dangling")
	symlink("small.txt", "sym-hl-1")
	link("sym-hl-1", "sym-hl-2")

	// Special files: FIFO (hard-linked too), /dev/null-like char device,
	// a socket inode.
	mknod("fifo", unix.S_IFIFO|0o644, 0)
	link("fifo", "sub/fifo-link")
	mknod("null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	mknod("sock", unix.S_IFSOCK|0o755, 0)

	// setuid / setgid / sticky, and owners.
	write("setuid", RandomBytes(8, 4096), 0o644)
	must(unix.Chown(p("setuid"), UID, GID), "chown setuid")
	must(unix.Chmod(p("setuid"), 0o4755), "chmod setuid")
	write("setgid", []byte("#!/bin/sh\n"), 0o2755)
	mkdir("setgid-dir", 0o2775)
	mkdir("sticky", 0o1777)
	mkdir("owned", 0o750)
	write("owned/file", RandomBytes(9, 1000), 0o640)
	symlink("file", "owned/link")
	mknod("owned/fifo", unix.S_IFIFO|0o600, 0)
	for _, rel := range []string{"owned", "owned/file", "owned/fifo"} {
		must(unix.Chown(p(rel), UID, GID), "chown "+rel)
	}
	must(unix.Lchown(p("owned/link"), UID, GID), "lchown owned/link")
	must(unix.Chmod(p("owned"), 0o750), "chmod owned") // chown kept it, but be explicit

	// Extended attributes: user.*, an empty value, a large value, on a
	// file and a directory; POSIX ACLs (access on a file, default and
	// access on a directory, inherited by a file created below it); a file
	// capability (chown would clear it: it must survive the copy's chown).
	write("xattr-file", []byte("x"), 0o644)
	setx("xattr-file", "user.a", []byte("1"))
	setx("xattr-file", "user.empty", nil)
	setx("xattr-file", "user.big", RandomBytes(10, 3000))
	mkdir("xattr-dir", 0o755)
	setx("xattr-dir", "user.dirattr", []byte("on a directory"))
	write("acl-file", []byte("acl"), 0o640)
	setx("acl-file", "system.posix_acl_access", sampleACL())
	mkdir("acl-dir", 0o770)
	setx("acl-dir", "system.posix_acl_access", sampleACL())
	setx("acl-dir", "system.posix_acl_default", sampleACL())
	write("acl-dir/inherited", []byte("inherits the default ACL"), 0o666)
	write("cap-file", []byte("\x7fELF"), 0o755)
	setx("cap-file", "security.capability", capNetBindService())

	// An empty directory and a deep one.
	mkdir("empty-dir", 0o700)
	deep := "deep"
	mkdir(deep, 0o755)
	for i := 1; i <= 24; i++ {
		deep = filepath.Join(deep, "d"+string(rune('a'+i%26))+strings.Repeat("x", i))
		mkdir(deep, 0o755)
	}
	write(filepath.Join(deep, "leaf"), RandomBytes(11, 123), 0o600)
	link("hl-a", filepath.Join(deep, "hl-c"))

	// Nanosecond mtimes (and atimes), distinct per entry; directories last
	// is not needed: changing a child's times does not touch its parent.
	i := int64(0)
	err = filepath.WalkDir(root, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		i++
		mt := unix.NsecToTimespec(1_600_000_000_000_000_000 + i*1_000_003_001 + i*7919)
		at := unix.NsecToTimespec(1_500_000_000_123_456_789 + i)
		return unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{at, mt}, unix.AT_SYMLINK_NOFOLLOW)
	})
	must(err, "set times")
	return r
}
