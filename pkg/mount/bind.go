package mount

import (
	"fmt"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// table answers "is it a mount point" (mount-utils: statx, falling back to
// the mount table for bind mounts the fast check cannot tell).
var table = mountutils.New("")

// IsMountPoint implements Interface (mount-utils IsMountPoint).
func (*Mounter) IsMountPoint(p string) (bool, error) { return table.IsMountPoint(p) }

// Shows implements Interface.
func (mt *Mounter) Shows(p, src string) (bool, error) {
	isMnt, err := mt.IsMountPoint(p)
	if err != nil || !isMnt {
		return false, err
	}
	return shows(p, src)
}

// Bind implements Interface.
func (mt *Mounter) Bind(b Bind) error {
	from := b.from()
	inherited, err := statfsFlags(from)
	if err != nil {
		return fmt.Errorf("statfs %s: %w", from, err)
	}
	isMnt, err := mt.IsMountPoint(b.Target)
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", b.Target, err)
	}
	if isMnt {
		return checkExisting(b, inherited)
	}
	fd, err := openTarget(b.Target, b.Source)
	if err != nil {
		return fmt.Errorf("%w: open %s: %v", contract.ErrInvalid, b.Target, err)
	}
	err = unix.Mount(from, fdPath(fd), "", unix.MS_BIND, "")
	_ = unix.Close(fd)
	if err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", from, b.Target, err)
	}
	if b.Flags.needsRemount(inherited, b.ReadOnly) {
		if err := remount(b.Target, b.Source, b.Flags.apply(inherited, b.ReadOnly)); err != nil {
			if uerr := unmountAll(b.Target); uerr != nil {
				klog.ErrorS(uerr, "Could not undo a failed mount", "path", b.Target)
			}
			return err
		}
	}
	klog.V(4).InfoS("Bind mounted", "source", from, "target", b.Target, "readonly", b.ReadOnly, "flags", b.Flags.list)
	return nil
}

// checkExisting judges the mount already at b.Target: it must show
// b.Source with the flags b asks for, else contract.ErrExists.
func checkExisting(b Bind, inherited uintptr) error {
	same, err := shows(b.Target, b.Source)
	if err != nil {
		return fmt.Errorf("stat %s: %w", b.Target, err)
	}
	if !same {
		return fmt.Errorf("%w: something else is already mounted at %q (another volume or filesystem, or this block volume published with the other readonly)", contract.ErrExists, b.Target)
	}
	actual, err := statfsFlags(b.Target)
	if err != nil {
		return fmt.Errorf("statfs %s: %w", b.Target, err)
	}
	if !b.Flags.matches(actual, inherited, b.ReadOnly) {
		return fmt.Errorf("%w: volume is already mounted at %q with other flags (readonly or mount_flags differ)", contract.ErrExists, b.Target)
	}
	return nil
}

// shows reports whether p shows vol: for a directory vol the same device and
// inode, for a block device node vol a node of the same device number.
func shows(p, vol string) (bool, error) {
	var sp, sv unix.Stat_t
	if err := unix.Stat(vol, &sv); err != nil {
		return false, err
	}
	if err := unix.Stat(p, &sp); err != nil {
		return false, err
	}
	if sv.Mode&unix.S_IFMT == unix.S_IFBLK {
		return sp.Mode&unix.S_IFMT == unix.S_IFBLK && sp.Rdev == sv.Rdev, nil
	}
	return sp.Dev == sv.Dev && sp.Ino == sv.Ino, nil
}

func statfsFlags(p string) (uintptr, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		return 0, err
	}
	return uintptr(s.Flags), nil
}

// openTarget opens target with O_PATH|O_NOFOLLOW (so a symlink swapped in
// is never followed), as a directory unless vol is a device node.
func openTarget(target, vol string) (int, error) {
	flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
	var st unix.Stat_t
	if err := unix.Stat(vol, &st); err != nil {
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		flags |= unix.O_DIRECTORY
	}
	return unix.Open(target, flags, 0)
}

// remount applies per-mount flags to the fresh bind mount at target, after
// re-opening it without following symlinks and checking it shows vol.
func remount(target, vol string, flags uintptr) error {
	fd, err := openTarget(target, vol)
	if err != nil {
		return fmt.Errorf("reopen %s: %w", target, err)
	}
	defer unix.Close(fd)
	if same, err := shows(fdPath(fd), vol); err != nil || !same {
		return fmt.Errorf("mount at %s changed under us", target)
	}
	if err := unix.Mount("", fdPath(fd), "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
		return fmt.Errorf("remount %s with flags %#x: %w", target, flags, err)
	}
	return nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }
