package engine

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// compressionXattr is the btrfs "compression" property: directories pass it
// on, files compress later writes with it; "none" overrides the mount.
const compressionXattr = "btrfs.compression"

// OnBtrfs reports whether path is on a btrfs filesystem.
func OnBtrfs(path string) bool { return onBtrfs(path) }

// SetCompression sets the btrfs compression property algo on the root, every
// directory and every regular file of the tree at root, for later writes.
// Entries are opened relative to their parent with O_NOFOLLOW, so a symlink
// is never followed out of the tree.
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
