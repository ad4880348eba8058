package engine

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// compressionXattr is the btrfs property "compression" as an extended
// attribute (btrfs-progs `btrfs property set … compression`): on a
// directory, files and directories created in it inherit it; on a file,
// its later writes are compressed with it. The values are "zstd", "lzo",
// "zlib", and "none" (no compression, whatever the mount options say).
const compressionXattr = "btrfs.compression"

// OnBtrfs reports whether path is on a btrfs filesystem.
func OnBtrfs(path string) bool { return onBtrfs(path) }

// SetCompression sets the btrfs compression property algo (a value of
// contract.Compressions) on the directory tree at root — the root, every
// directory and every regular file below it — so that every later write
// in the tree, to new files and existing ones, is compressed with algo.
// Data already written stays as it is. The walk opens each entry relative
// to its parent with O_NOFOLLOW and sets the property on the open file, so
// a symlink (or a directory swapped for one while the walk runs) is never
// followed out of the tree; entries that are neither directories nor
// regular files are skipped. Errors: root not a directory on btrfs, or
// the first failed open or setxattr(2).
func SetCompression(root, algo string) error {
	if !onBtrfs(root) {
		return fmt.Errorf("%s is not on btrfs", root)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	return compressTree(fd, root, []byte(algo))
}

// compressTree sets the property on the open directory fd (named path, for
// errors) and everything below it; it closes fd.
func compressTree(fd int, path string, value []byte) error {
	dir := os.NewFile(uintptr(fd), path)
	defer dir.Close()
	if err := unix.Fsetxattr(fd, compressionXattr, value, 0); err != nil {
		return fmt.Errorf("set %s on %s: %w", compressionXattr, path, err)
	}
	for {
		names, err := dir.Readdirnames(256)
		for _, name := range names {
			if err := compressEntry(fd, path+"/"+name, name, value); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read directory %s: %w", path, err)
		}
	}
}

// compressEntry sets the property on the entry name of the directory
// dirfd: a directory's whole tree, a regular file itself.
func compressEntry(dirfd int, path, name string, value []byte) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENXIO):
		return nil // a symlink, gone meanwhile, or a socket
	case err != nil:
		return fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fmt.Errorf("stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return compressTree(fd, path, value)
	case unix.S_IFREG:
		defer unix.Close(fd)
		if err := unix.Fsetxattr(fd, compressionXattr, value, 0); err != nil {
			return fmt.Errorf("set %s on %s: %w", compressionXattr, path, err)
		}
		return nil
	default:
		unix.Close(fd)
		return nil
	}
}

// Compression reads the btrfs compression property of path ("" when it
// has none).
func Compression(path string) (string, error) {
	buf := make([]byte, 16)
	n, err := unix.Lgetxattr(path, compressionXattr, buf)
	if errors.Is(err, unix.ENODATA) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
