package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/block"
)

// The node side. Staged and published state is always read from the mount
// table (mountinfo, statfs, stat) and never from records, so a reboot, an
// unmount by hand or a driver crash between calls is seen as it is.
//
// Mounts are made with mount(2) directly, not by exec'ing mount(8): a bind
// mount is one syscall (~20 µs) while mount(8) costs a fork+exec (~2–5 ms)
// per call; see the node-cycle figures of `make bench`. The mount target is
// opened with O_PATH|O_NOFOLLOW first and the mount made on /proc/self/fd/N,
// so a symlink swapped in at the last path component can never redirect a
// mount (CVE-2017-1002101 / CVE-2021-25741 class).

var mounter = mount.New("")

// Stage prepares volume id on this node (CSI NodeStageVolume). A mount
// volume is bind-mounted onto stagingPath, which must be an existing
// directory that is not a symlink; repeating a stage with the same flags
// succeeds, while a different volume, other flags or a foreign filesystem
// already mounted there give ErrExists. A block volume gets its loop device
// attached (found again by its image file if it already is). accessType is
// what the request's capability asks for. Errors: ErrNotFound, ErrInvalid,
// ErrExists, ErrPrecondition (capability of the other access type).
func (m *Manager) Stage(id, stagingPath, accessType string, flags []string) error {
	v, err := m.Get(id)
	if err != nil {
		return err
	}
	if err := matchAccess(v, accessType); err != nil {
		return err
	}
	mf, err := ParseMountFlags(flags)
	if err != nil {
		return err
	}
	if err := checkDir(stagingPath, "staging_target_path", false); err != nil {
		return err
	}
	if v.AccessType == state.AccessBlock {
		dev, err := block.Attach(m.imagePath(id))
		if err != nil {
			return err
		}
		klog.V(2).InfoS("Block volume staged", "volumeID", id, "device", dev)
		return nil
	}
	src := m.volDir(id)
	return bindOnce(src, src, stagingPath, mf, false)
}

func matchAccess(v *state.Volume, accessType string) error {
	if v.AccessType != accessType {
		return fmt.Errorf("%w: volume %s is a %s volume; the capability asks for %s", ErrPrecondition, v.ID, v.AccessType, accessType)
	}
	return nil
}

// Unstage undoes Stage (CSI NodeUnstageVolume): stagingPath is unmounted
// (the directory itself belongs to the CO and stays) and a block volume's
// loop device detached. Not staged, and unknown volumes, are success.
func (m *Manager) Unstage(id, stagingPath string) error {
	if err := cleanupPath(stagingPath); err != nil {
		return err
	}
	v, err := m.Resolve(id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if v.AccessType == state.AccessBlock {
		return block.Detach(m.imagePath(v.ID))
	}
	return nil
}

// Publish makes the staged volume visible at targetPath (CSI
// NodePublishVolume). A mount volume is bind-mounted from stagingPath onto
// targetPath, a directory created (one level, its parent must exist) unless
// it exists. A block volume's loop device node is bind-mounted onto
// targetPath, a file created the same way. A symlink at targetPath is
// refused with ErrInvalid. ErrPrecondition when the volume is not staged. A
// repeated publish with the same readonly/flags succeeds; any other mount on
// targetPath gives ErrExists.
//
// With singleWriter (SINGLE_NODE_SINGLE_WRITER) the volume may be published
// at one target path only: ErrPrecondition when it is published elsewhere.
func (m *Manager) Publish(id, stagingPath, targetPath, accessType string, readonly, singleWriter bool, flags []string) error {
	v, err := m.Get(id)
	if err != nil {
		return err
	}
	if err := matchAccess(v, accessType); err != nil {
		return err
	}
	mf, err := ParseMountFlags(flags)
	if err != nil {
		return err
	}
	if v.AccessType == state.AccessBlock {
		dev, err := block.Find(m.imagePath(id))
		if err != nil || dev == "" {
			return fmt.Errorf("%w: block volume %s is not staged (no loop device attached; call NodeStageVolume first)", ErrPrecondition, id)
		}
		if singleWriter {
			if err := onlyAt(id, dev, targetPath); err != nil {
				return err
			}
		}
		return publishDevice(dev, targetPath, readonly)
	}
	src := m.volDir(id)
	if ok, err := holds(stagingPath, src); err != nil || !ok {
		return fmt.Errorf("%w: volume %s is not staged at %q (call NodeStageVolume first)", ErrPrecondition, id, stagingPath)
	}
	if singleWriter {
		if err := onlyAt(id, src, stagingPath, targetPath); err != nil {
			return err
		}
	}
	if err := checkDir(targetPath, "target_path", true); err != nil {
		return err
	}
	return bindOnce(src, stagingPath, targetPath, mf, readonly)
}

// onlyAt enforces SINGLE_NODE_SINGLE_WRITER: the volume's data src (its
// directory, or its loop device node) may be mounted only at the given paths.
func onlyAt(id, src string, paths ...string) error {
	points, _, err := mountsOf(src)
	if err != nil {
		return err
	}
	allowed := map[string]bool{}
	for _, p := range paths {
		allowed[resolved(p)] = true
	}
	for _, p := range points {
		if !allowed[p] {
			return fmt.Errorf("%w: volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %q", ErrPrecondition, id, p)
		}
	}
	return nil
}

// PublishEphemeral bind-mounts the ephemeral volume v (no staging) onto
// targetPath, created as for Publish. Errors as for Publish.
func (m *Manager) PublishEphemeral(v *state.Volume, targetPath string, readonly bool, flags []string) error {
	mf, err := ParseMountFlags(flags)
	if err != nil {
		return err
	}
	if err := checkDir(targetPath, "target_path", true); err != nil {
		return err
	}
	src := m.volDir(v.ID)
	return bindOnce(src, src, targetPath, mf, readonly)
}

// publishDevice bind-mounts the block device node dev onto the file
// targetPath (created if missing, mode 0600; its parent must exist).
func publishDevice(dev, targetPath string, readonly bool) error {
	if c := filepath.Clean(targetPath); !filepath.IsAbs(targetPath) || c != targetPath {
		return fmt.Errorf("%w: target_path %q must be an absolute, clean path", ErrInvalid, targetPath)
	}
	rdev, err := block.Rdev(dev)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(targetPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		fd, err := unix.Open(targetPath, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: parent directory of target_path %q does not exist", ErrInvalid, targetPath)
		}
		if err != nil {
			return fmt.Errorf("create %s: %w", targetPath, err)
		}
		unix.Close(fd)
	case err != nil && mount.IsCorruptedMnt(err):
		// A dead mount sits on the device file: remove it and look again.
		if err := unmountTop(targetPath); err != nil {
			return err
		}
		return publishDevice(dev, targetPath, readonly)
	case err != nil:
		return fmt.Errorf("lstat %s: %w", targetPath, err)
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("%w: target_path %q is a symlink; refusing to mount over it", ErrInvalid, targetPath)
	case fi.IsDir():
		return fmt.Errorf("%w: target_path %q is a directory; a block volume is published as a device file", ErrInvalid, targetPath)
	}
	isMnt, err := mounter.IsMountPoint(targetPath)
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", targetPath, err)
	}
	if isMnt {
		var st unix.Stat_t
		if err := unix.Stat(targetPath, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != rdev {
			return fmt.Errorf("%w: something else is already mounted at %q", ErrExists, targetPath)
		}
		return nil
	}
	fd, err := unix.Open(targetPath, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: open %s: %v", ErrInvalid, targetPath, err)
	}
	err = unix.Mount(dev, fdPath(fd), "", unix.MS_BIND, "")
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", dev, targetPath, err)
	}
	if readonly {
		fd, err := unix.Open(targetPath, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Mount("", fdPath(fd), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, "")
			unix.Close(fd)
		}
		if err != nil {
			_ = unmountAll(targetPath)
			return fmt.Errorf("remount %s read-only: %w", targetPath, err)
		}
	}
	klog.V(4).InfoS("Device bind mounted", "device", dev, "target", targetPath, "readonly", readonly)
	return nil
}

// Unpublish unmounts targetPath (every stacked mount on it, broken FUSE
// mounts included) and removes it (CSI NodeUnpublishVolume). A missing path
// or one that is not mounted is success; a symlink is removed without being
// followed. It needs no record: it works for volumes the driver no longer
// knows. ErrPrecondition when the path is a non-empty directory that is not
// a mount: that is not ours to delete.
func Unpublish(targetPath string) error {
	if err := cleanupPath(targetPath); err != nil {
		return err
	}
	if err := os.Remove(targetPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: %s is not a mount point and not empty; refusing to remove it", ErrPrecondition, targetPath)
		}
		return fmt.Errorf("remove %s: %w", targetPath, err)
	}
	return nil
}

// cleanupPath unmounts everything mounted on p. A symlink at p is removed
// (never followed); a missing p is fine.
func cleanupPath(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%w: path %q must be absolute", ErrInvalid, p)
	}
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil && !mount.IsCorruptedMnt(err):
		return fmt.Errorf("lstat %s: %w", p, err)
	case err == nil && fi.Mode()&os.ModeSymlink != 0:
		return os.Remove(p)
	}
	return unmountAll(p)
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
			return fmt.Errorf("%w: %s is busy: %v", ErrPrecondition, p, err)
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

// checkDir validates a CO-given staging or target path: absolute, clean,
// not a symlink, a directory. With create, a missing last component is made
// (mode 0750); its parent must exist.
func checkDir(p, field string, create bool) error {
	if c := filepath.Clean(p); !filepath.IsAbs(p) || (c != p && c+"/" != p) {
		return fmt.Errorf("%w: %s %q must be an absolute, clean path", ErrInvalid, field, p)
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return fmt.Errorf("%w: %s %q does not exist", ErrInvalid, field, p)
		}
		if err := os.Mkdir(p, 0o750); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: parent directory of %s %q does not exist", ErrInvalid, field, p)
			}
			if !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create %s: %w", p, err)
			}
		}
		fi, err = os.Lstat(p)
	}
	if err != nil {
		if mount.IsCorruptedMnt(err) {
			// A dead mount sits there: remove it (only it: a healthy mount
			// under it is judged as any other) so a fresh mount can go on.
			if err := unmountTop(p); err != nil {
				return err
			}
			return checkDir(p, field, create)
		}
		return fmt.Errorf("lstat %s: %w", p, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s %q is a symlink; refusing to mount over it", ErrInvalid, field, p)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s %q is not a directory", ErrInvalid, field, p)
	}
	return nil
}

// holds reports whether p is a mount point showing the directory vol (same
// device and inode as vol's root).
func holds(p, vol string) (bool, error) {
	isMnt, err := mounter.IsMountPoint(p)
	if err != nil || !isMnt {
		return false, err
	}
	return sameFile(p, vol)
}

func sameFile(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

func statfsFlags(p string) (uintptr, error) {
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		return 0, err
	}
	return uintptr(s.Flags), nil
}

// bindOnce makes target a bind mount of src (whose data is the directory
// vol) with the requested flags, or checks that it already is one.
func bindOnce(vol, src, target string, mf mountFlags, readonly bool) error {
	inherited, err := statfsFlags(src)
	if err != nil {
		return fmt.Errorf("statfs %s: %w", src, err)
	}
	isMnt, err := mounter.IsMountPoint(target)
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", target, err)
	}
	if isMnt {
		same, err := sameFile(target, vol)
		if err != nil {
			return fmt.Errorf("stat %s: %w", target, err)
		}
		if !same {
			return fmt.Errorf("%w: another filesystem or volume is already mounted at %q", ErrExists, target)
		}
		actual, err := statfsFlags(target)
		if err != nil {
			return fmt.Errorf("statfs %s: %w", target, err)
		}
		if !mf.matches(actual, inherited, readonly) {
			return fmt.Errorf("%w: volume is already mounted at %q with other flags (readonly or mount_flags differ)", ErrExists, target)
		}
		return nil
	}
	fd, err := unix.Open(target, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: open %s: %v", ErrInvalid, target, err)
	}
	err = unix.Mount(src, fdPath(fd), "", unix.MS_BIND, "")
	_ = unix.Close(fd)
	if err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", src, target, err)
	}
	if mf.needsRemount(inherited, readonly) {
		if err := remount(target, vol, mf.apply(inherited, readonly)); err != nil {
			if uerr := unmountAll(target); uerr != nil {
				klog.ErrorS(uerr, "Could not undo a failed mount", "path", target)
			}
			return err
		}
	}
	klog.V(4).InfoS("Bind mounted", "source", src, "target", target, "readonly", readonly, "flags", mf.list)
	return nil
}

// remount applies per-mount flags to the fresh bind mount at target, after
// re-opening it without following symlinks and checking it shows vol.
func remount(target, vol string, flags uintptr) error {
	fd, err := unix.Open(target, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("reopen %s: %w", target, err)
	}
	defer unix.Close(fd)
	if same, err := sameFile(fdPath(fd), vol); err != nil || !same {
		return fmt.Errorf("mount at %s changed under us", target)
	}
	if err := unix.Mount("", fdPath(fd), "", unix.MS_REMOUNT|unix.MS_BIND|flags, ""); err != nil {
		return fmt.Errorf("remount %s with flags %#x: %w", target, flags, err)
	}
	return nil
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// mountedAnywhere reports whether the directory dir (under the data root) is
// the source of a mount anywhere in this mount namespace, or has a mount
// inside it.
func (m *Manager) mountedAnywhere(dir string) (bool, error) {
	points, nested, err := mountsOf(dir)
	return len(points) > 0 || nested, err
}

// mountsOf returns the mount points that show the directory dir, read from
// /proc/self/mountinfo: a bind mount of dir has dir's device and a root equal
// to dir's path inside its filesystem. nested reports a mount below dir.
func mountsOf(dir string) (points []string, nested bool, err error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, false, fmt.Errorf("read mount table: %w", err)
	}
	// The mount that contains dir: the longest mount point prefix.
	var host *mountinfo.Info
	for _, mi := range mounts {
		if within(dir, mi.Mountpoint) && (host == nil || len(mi.Mountpoint) >= len(host.Mountpoint)) {
			host = mi
		}
	}
	if host == nil {
		return nil, false, fmt.Errorf("no mount contains %s", dir)
	}
	rel, _ := filepath.Rel(host.Mountpoint, dir)
	rootInFS := filepath.Join(host.Root, rel)
	for _, mi := range mounts {
		if mi.Major == host.Major && mi.Minor == host.Minor && within(mi.Root, rootInFS) && mi.Mountpoint != dir {
			points = append(points, mi.Mountpoint)
		}
		if mi.Mountpoint != dir && within(mi.Mountpoint, dir) {
			nested = true
		}
	}
	return points, nested, nil
}

// within reports whether p is base or below it.
func within(p, base string) bool {
	if base == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == base || strings.HasPrefix(p, base+"/")
}

// resolved is p with symlinks resolved, as the mount table shows it.
func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}
