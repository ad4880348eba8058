package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Unmount implements Interface.
func (*Mounter) Unmount(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%w: path %q must be absolute", contract.ErrInvalid, p)
	}
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil && !mountutils.IsCorruptedMnt(err):
		return fmt.Errorf("lstat %s: %w", p, err)
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		return os.Remove(p)
	}
	return unmountAll(p)
}

// Remove implements Interface.
func (mt *Mounter) Remove(p string) error {
	if err := mt.Unmount(p); err != nil {
		return err
	}
	return removeUnmounted(p)
}

// removeUnmounted removes p when it is what a publish makes (an empty
// directory or file); anything else stays (contract.ErrPrecondition).
func removeUnmounted(p string) error {
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("lstat %s: %w", p, err)
	case fi.Mode().IsRegular() && fi.Size() > 0:
		return fmt.Errorf("%w: %s is not a mount point and holds %d bytes; refusing to remove a file a publish did not create", contract.ErrPrecondition, p, fi.Size())
	case !fi.IsDir() && !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s is not a mount point but a %s; refusing to remove what a publish did not create", contract.ErrPrecondition, p, fileKind(fi.Mode()))
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: %s is not a mount point and not empty; refusing to remove it", contract.ErrPrecondition, p)
		}
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// unmountTop removes the topmost mount at p, a broken one (a FUSE mount
// whose server died), lazily if a plain unmount is refused.
func unmountTop(p string) error {
	if err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW); err != nil {
		if derr := unix.Unmount(p, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); derr != nil {
			return fmt.Errorf("unmount the broken mount at %s: %w", p, err)
		}
	}
	klog.V(2).InfoS("Removed a broken mount", "path", p)
	return nil
}

// unmountAll removes every mount stacked on p. UMOUNT_NOFOLLOW keeps a
// symlink from redirecting the unmount; EINVAL means "not a mount point".
func unmountAll(p string) error {
	for i := 0; i < 64; i++ {
		err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
		switch {
		case err == nil:
			klog.V(4).InfoS("Unmounted", "path", p)
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.EBUSY):
			return fmt.Errorf("%w: %s is busy: %v", contract.ErrPrecondition, p, err)
		default:
			// A broken mount (dead FUSE daemon) may refuse a plain unmount.
			if derr := unix.Unmount(p, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH); derr == nil {
				continue
			}
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return fmt.Errorf("unmount %s: too many stacked mounts", p)
}
