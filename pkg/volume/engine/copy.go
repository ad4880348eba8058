// Package engine holds localdir's storage engines: the ways a volume's data
// is laid out on the node's filesystem, snapshotted, cloned and limited.
package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// CopyStats counts what CopyTree did.
type CopyStats struct {
	Files, Dirs, Symlinks, HardLinks, Specials int
	// Cloned is the number of regular files whose extents were shared
	// (FICLONE) instead of copied.
	Cloned int
	// BytesCopied is the data actually copied (not cloned, holes skipped).
	BytesCopied int64
}

// CopyTree copies the directory tree at src into dst (which must not exist)
// with file types, modes, owners, nanosecond times, xattrs (ACLs), symlinks,
// hard links, device nodes, FIFOs and holes. Data is shared with FICLONE
// where the filesystem has reflinks, else copied with copy_file_range(2).
// The walk is fd-relative with O_NOFOLLOW, so a symlink swapped into a live
// src never leads outside it; other filesystems below src are copied empty.
// On error dst may be partly written; the caller removes it.
func CopyTree(src, dst string) (CopyStats, error) { return copyTree(src, dst, false) }

// CopySnapshotTree is CopyTree for a source that must not change (a
// snapshot): an entry that vanishes fails the copy instead of being skipped,
// as CopyTree does for a live volume (case C34).
func CopySnapshotTree(src, dst string) (CopyStats, error) { return copyTree(src, dst, true) }

// CopyTreeInto is CopyTree (CopySnapshotTree with strict) into dst, an
// empty directory that exists: one the caller prepared, such as one with
// an encryption policy that every entry copied into it inherits.
func CopyTreeInto(src, dst string, strict bool) (CopyStats, error) {
	return copyTreeAt(src, dst, strict, false)
}

func copyTree(src, dst string, strict bool) (CopyStats, error) {
	return copyTreeAt(src, dst, strict, true)
}

func copyTreeAt(src, dst string, strict, mkdir bool) (CopyStats, error) {
	var st CopyStats
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(sfd)
	var root unix.Stat_t
	if err := unix.Fstat(sfd, &root); err != nil {
		return st, err
	}
	if mkdir {
		if err := unix.Mkdir(dst, 0o700); err != nil {
			return st, fmt.Errorf("mkdir %s: %w", dst, err)
		}
	}
	dfd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(dfd)
	c := &copier{dstRoot: dst, rootDev: root.Dev, links: map[uint64]string{}, st: &st, strict: strict}
	if err := c.dir(sfd, dfd, ""); err != nil {
		return st, err
	}
	if err := c.attrsFd(sfd, dfd, &root); err != nil {
		return st, err
	}
	st.Dirs++
	return st, nil
}

type copier struct {
	dstRoot string
	rootDev uint64
	links   map[uint64]string // source inode → path (relative to dstRoot) of its first copy
	st      *CopyStats
	strict  bool // a vanished entry is an error (CopySnapshotTree)
}

// dir copies the entries of the open source directory sfd into dfd. rel is
// the directory's path relative to the roots, for hard links and errors.
func (c *copier) dir(sfd, dfd int, rel string) error {
	names, err := readDirNames(sfd)
	if err != nil {
		return fmt.Errorf("read %s: %w", c.show(rel), err)
	}
	for _, name := range names {
		if err := c.entry(sfd, dfd, name, filepath.Join(rel, name)); err != nil {
			return err
		}
	}
	return nil
}

func (c *copier) show(rel string) string {
	if rel == "" {
		return "/"
	}
	return rel
}

func (c *copier) entry(sfd, dfd int, name, rel string) error {
	var s unix.Stat_t
	if err := unix.Fstatat(sfd, name, &s, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) && !c.strict {
			return nil // removed while we copy a live volume
		}
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%s vanished from the source during the copy: %w", rel, err)
		}
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	// Later names of a non-directory (symlinks too: link(2) does not follow
	// them) become hard links to its first copy.
	if s.Mode&unix.S_IFMT != unix.S_IFDIR && s.Nlink > 1 {
		if first, ok := c.links[s.Ino]; ok {
			if err := unix.Linkat(unix.AT_FDCWD, filepath.Join(c.dstRoot, first), dfd, name, 0); err != nil {
				return fmt.Errorf("link %s: %w", rel, err)
			}
			c.st.HardLinks++
			return nil
		}
		c.links[s.Ino] = rel
	}
	switch s.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return c.subdir(sfd, dfd, name, rel, &s)
	case unix.S_IFREG:
		return c.file(sfd, dfd, name, rel, &s)
	case unix.S_IFLNK:
		target, err := readlinkat(sfd, name)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", rel, err)
		}
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return fmt.Errorf("symlink %s: %w", rel, err)
		}
		c.st.Symlinks++
		return c.attrsAt(sfd, dfd, name, &s)
	default: // devices, FIFOs, sockets
		if err := unix.Mknodat(dfd, name, s.Mode&unix.S_IFMT|0o600, int(s.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", rel, err)
		}
		c.st.Specials++
		return c.attrsAt(sfd, dfd, name, &s)
	}
}

// subdir copies directory name of sfd into dfd: its entries unless it is
// another filesystem, then its attributes.
func (c *copier) subdir(sfd, dfd int, name, rel string, s *unix.Stat_t) error {
	if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", rel, err)
	}
	cfd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer unix.Close(cfd)
	nfd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	if s.Dev == c.rootDev {
		if err := c.dir(cfd, nfd, rel); err != nil {
			return err
		}
	}
	c.st.Dirs++
	return c.attrsFd(cfd, nfd, s)
}

func (c *copier) file(sfd, dfd int, name, rel string, s *unix.Stat_t) error {
	in, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer unix.Close(in)
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	defer unix.Close(out)
	cloned, n, err := CopyData(out, in)
	if err != nil {
		return fmt.Errorf("copy %s: %w", rel, err)
	}
	c.st.Files++
	c.st.BytesCopied += n
	if cloned {
		c.st.Cloned++
	}
	return c.attrsFd(in, out, s)
}

// attrsFd copies owner, mode, xattrs and times of s onto dst, in that order:
// chown clears setuid/setgid and file capabilities.
func (c *copier) attrsFd(src, dst int, s *unix.Stat_t) error {
	if err := unix.Fchown(dst, int(s.Uid), int(s.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(dst, s.Mode&0o7777); err != nil {
		return err
	}
	if err := copyXattrs(fdXattr(src), fdXattr(dst)); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(dst), []unix.Timespec{s.Atim, s.Mtim}, 0)
}

// attrsAt does the same for entry name of dfd, copied from name in sfd
// (symlinks and special files), never following the last component.
func (c *copier) attrsAt(sfd, dfd int, name string, s *unix.Stat_t) error {
	if err := unix.Fchownat(dfd, name, int(s.Uid), int(s.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if s.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, s.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	// /proc/self/fd/N pins the directory; l*xattr does not follow name.
	if err := copyXattrs(pathXattr(fdPath(sfd)+"/"+name), pathXattr(fdPath(dfd)+"/"+name)); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, name, []unix.Timespec{s.Atim, s.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func readDirNames(fd int) ([]string, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), "dir")
	defer f.Close()
	return f.Readdirnames(-1)
}

func readlinkat(dfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// xattrIO reads and writes the extended attributes of one file, by fd or
// by path (l*xattr: the last component is never followed).
type xattrIO struct {
	list func(dest []byte) (int, error)
	get  func(name string, dest []byte) (int, error)
	set  func(name string, val []byte) error
}

func fdXattr(fd int) xattrIO {
	return xattrIO{
		list: func(d []byte) (int, error) { return unix.Flistxattr(fd, d) },
		get:  func(n string, d []byte) (int, error) { return unix.Fgetxattr(fd, n, d) },
		set:  func(n string, v []byte) error { return unix.Fsetxattr(fd, n, v, 0) },
	}
}

func pathXattr(p string) xattrIO {
	return xattrIO{
		list: func(d []byte) (int, error) { return unix.Llistxattr(p, d) },
		get:  func(n string, d []byte) (int, error) { return unix.Lgetxattr(p, n, d) },
		set:  func(n string, v []byte) error { return unix.Lsetxattr(p, n, v, 0) },
	}
}

// copyXattrs copies every extended attribute (POSIX ACLs are the
// system.posix_acl_* ones) from src to dst.
func copyXattrs(src, dst xattrIO) error {
	xs, err := readXattrs(src)
	if err != nil {
		return err
	}
	return writeXattrs(dst, xs)
}

// readXattrs reads every extended attribute of src, in listed order (none
// where the filesystem has no xattrs).
func readXattrs(src xattrIO) ([]xattr, error) {
	names, err := readSized(src.list)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	var out []xattr
	for _, n := range splitNul(names) {
		val, err := readSized(func(d []byte) (int, error) { return src.get(n, d) })
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return nil, fmt.Errorf("getxattr %s: %w", n, err)
		}
		out = append(out, xattr{Name: n, Value: val})
	}
	return out, nil
}

func writeXattrs(dst xattrIO, xs []xattr) error {
	for _, x := range xs {
		if err := dst.set(x.Name, x.Value); err != nil {
			return fmt.Errorf("setxattr %s: %w", x.Name, err)
		}
	}
	return nil
}

// readSized calls a size-then-fill syscall pair, retrying if the value grew.
func readSized(f func([]byte) (int, error)) ([]byte, error) {
	for {
		sz, err := f(nil)
		if err != nil || sz == 0 {
			return nil, err
		}
		buf := make([]byte, sz)
		n, err := f(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

func splitNul(b []byte) []string {
	var out []string
	start := 0
	for i, c := range b {
		if c == 0 {
			if i > start {
				out = append(out, string(b[start:i]))
			}
			start = i + 1
		}
	}
	return out
}

// CopyData copies in to out (out empty) by FICLONE, else with
// copy_file_range(2) over the data segments, holes kept. It returns whether
// the file was cloned and the bytes copied.
func CopyData(out, in int) (cloned bool, copied int64, err error) {
	var s unix.Stat_t
	if err := unix.Fstat(in, &s); err != nil {
		return false, 0, err
	}
	if s.Size == 0 {
		return false, 0, nil
	}
	if err := unix.IoctlFileClone(out, in); err == nil {
		return true, 0, nil
	}
	off := int64(0)
	for off < s.Size {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return false, copied, err
		}
		hole, err := unix.Seek(in, data, unix.SEEK_HOLE)
		if err != nil {
			return false, copied, err
		}
		n, err := copyRange(out, in, data, hole-data)
		copied += n
		if err != nil {
			return false, copied, err
		}
		off = hole
	}
	return false, copied, unix.Ftruncate(out, s.Size)
}

// copyRange copies n bytes at offset off from in to out at the same offset.
func copyRange(out, in int, off, n int64) (int64, error) {
	roff, woff := off, off
	var done int64
	for done < n {
		chunk := min(n-done, 1<<30)
		k, err := unix.CopyFileRange(in, &roff, out, &woff, int(chunk), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				m, err := copyRangeRW(out, in, roff, n-done)
				return done + m, err
			}
			return done, err
		}
		if k == 0 {
			break // file shrank under us
		}
		done += int64(k)
	}
	return done, nil
}

func copyRangeRW(out, in int, off, n int64) (int64, error) {
	buf := make([]byte, 1<<20)
	var done int64
	for done < n {
		k, err := unix.Pread(in, buf[:min(int64(len(buf)), n-done)], off+done)
		if err != nil {
			return done, err
		}
		if k == 0 {
			break
		}
		if _, err := unix.Pwrite(out, buf[:k], off+done); err != nil {
			return done, err
		}
		done += int64(k)
	}
	return done, nil
}
