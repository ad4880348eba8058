package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	mount "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
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

// Stage prepares volume id on this node (CSI NodeStageVolume). stagingPath
// must be an existing directory that is not a symlink. A mount volume is
// bind-mounted onto it: repeating a stage with the same flags succeeds,
// while a different volume, other flags or a foreign filesystem already
// mounted there give contract.ErrExists (bindOnce). A block volume gets its
// read-write loop device attached (found again by its image file if it
// already is) and a device node of it made at <stagingPath>/<id> (mode
// 0600; contract.ErrExists when something else is there): that is how the staging
// path shows the volume (NodeGetVolumeStats). accessType is what the
// request's capability asks for. Errors: contract.ErrNotFound, contract.ErrInvalid,
// contract.ErrExists, contract.ErrPrecondition (capability of the other access type), contract.ErrBusy
// (the volume is being deleted or expanded).
func (m *Manager) Stage(id, stagingPath, accessType string, flags []string) error {
	// Held while it mounts: a delete that checked the volume unused must
	// not remove its data under a mount made just after.
	release, err := m.holds.read(id, "a stage")
	if err != nil {
		return err
	}
	defer release()
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
	if v.AccessType == contract.AccessBlock {
		return m.stageBlock(id, stagingPath)
	}
	src := m.volDir(id)
	return bindOnce(src, src, stagingPath, mf, false)
}

// stageBlock attaches block volume id's read-write loop device and makes
// <stagingPath>/<id> a device node of it. A device this call attached is
// detached again when the node cannot be made.
func (m *Manager) stageBlock(id, stagingPath string) error {
	img := m.imagePath(id)
	had, err := block.FindMode(img, false)
	if err != nil {
		return err
	}
	dev, err := block.Attach(img)
	if err != nil {
		return err
	}
	p := stagedDevicePath(stagingPath, id)
	if err := placeDeviceNode(p, dev); err != nil {
		if had == "" {
			if derr := block.Detach(img); derr != nil {
				klog.ErrorS(derr, "Could not detach the loop device of a failed stage", "image", img)
			}
		}
		return err
	}
	klog.V(2).InfoS("Block volume staged", "volumeID", id, "device", dev, "node", p)
	return nil
}

// stagedDevicePath is the device node a block volume's stage puts in its
// staging directory: <stagingPath>/<id>.
func stagedDevicePath(stagingPath, id string) string {
	mustVolumeID(id)
	return filepath.Join(stagingPath, id)
}

// placeDeviceNode makes p a block device node (mode 0600) with the device
// number of the device node dev. A node of another device number there is
// stale (left from before a reboot, when loop numbers differed) and is
// replaced; anything else at p is contract.ErrExists.
func placeDeviceNode(p, dev string) error {
	rdev, err := block.Rdev(dev)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err := unix.Mknod(p, unix.S_IFBLK|0o600, int(rdev))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EEXIST) || attempt > 0 {
			return fmt.Errorf("create device node %s: %w", p, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return fmt.Errorf("%w: %s exists and is not a device node of the volume", contract.ErrExists, p)
		}
		if st.Rdev == rdev {
			return nil
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove stale device node %s: %w", p, err)
		}
	}
}

// removeStagedDevice removes the device node <stagingPath>/<id> that
// stageBlock made; anything else there is left alone.
func removeStagedDevice(stagingPath, id string) error {
	p := stagedDevicePath(stagingPath, id)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

func matchAccess(v *contract.Volume, accessType string) error {
	if v.AccessType != accessType {
		return fmt.Errorf("%w: volume %s is a %s volume; the capability asks for %s", contract.ErrPrecondition, v.ID, v.AccessType, accessType)
	}
	return nil
}

// Unstage undoes Stage (CSI NodeUnstageVolume): stagingPath is unmounted
// (the directory itself belongs to the CO and stays); for a block volume
// the device node <stagingPath>/<id> is removed and its loop devices,
// read-write and read-only, are detached. Not staged, and unknown volumes,
// are success.
func (m *Manager) Unstage(id, stagingPath string) error {
	if err := cleanupPath(stagingPath); err != nil {
		return err
	}
	v, err := m.Resolve(id)
	if errors.Is(err, contract.ErrNotFound) {
		if ValidVolumeID(id) {
			return removeStagedDevice(stagingPath, id)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if v.AccessType == contract.AccessBlock {
		if err := removeStagedDevice(stagingPath, v.ID); err != nil {
			return err
		}
		return block.Detach(m.imagePath(v.ID))
	}
	return nil
}

// Publish makes the staged volume visible at targetPath (CSI
// NodePublishVolume). A mount volume is bind-mounted from stagingPath onto
// targetPath, a directory created (one level, its parent must exist) unless
// it exists. A block volume's loop device node is bind-mounted onto
// targetPath, a file created the same way: the read-write device, or with
// readonly a second, read-only loop device on the same image
// (block.AttachReadOnly), so that writes fail at the device (EPERM), not
// only at a mount flag a device node ignores. A symlink at targetPath is
// refused with contract.ErrInvalid. contract.ErrPrecondition when the volume is not staged. A
// repeated publish with the same readonly/flags succeeds; any other mount on
// targetPath — another volume, or this one with another readonly or other
// flags — gives contract.ErrExists, for both access types (bindOnce).
//
// With singleWriter (SINGLE_NODE_SINGLE_WRITER) the volume may be published
// at one target path only: contract.ErrPrecondition when it is published elsewhere.
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
	if v.AccessType == contract.AccessBlock {
		return m.publishBlock(id, stagingPath, targetPath, readonly, singleWriter)
	}
	src := m.volDir(id)
	if ok, err := holds(stagingPath, src); err != nil || !ok {
		return fmt.Errorf("%w: volume %s is not staged at %q (call NodeStageVolume first)", contract.ErrPrecondition, id, stagingPath)
	}
	if singleWriter {
		if err := onlyAt(id, []string{src}, stagingPath, targetPath); err != nil {
			return err
		}
	}
	if err := checkDir(targetPath, "target_path", true); err != nil {
		return err
	}
	return bindOnce(src, stagingPath, targetPath, mf, readonly)
}

// onlyAt enforces SINGLE_NODE_SINGLE_WRITER: the volume's data srcs (its
// directory, or its loop device nodes) may be mounted only at the given
// paths.
func onlyAt(id string, srcs []string, paths ...string) error {
	allowed := map[string]bool{}
	for _, p := range paths {
		allowed[resolved(p)] = true
	}
	for _, src := range srcs {
		points, _, err := mountsOf(src)
		if err != nil {
			return err
		}
		for _, p := range points {
			if !allowed[p] {
				return fmt.Errorf("%w: volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %q", contract.ErrPrecondition, id, p)
			}
		}
	}
	return nil
}

// publishBlock is Publish for block volume id: the read-write loop device
// (attached by Stage) or the read-only one (attached here when missing) is
// bound onto the device file targetPath. A read-only device left without a
// mount by a failed publish is detached again.
func (m *Manager) publishBlock(id, stagingPath, targetPath string, readonly, singleWriter bool) error {
	img := m.imagePath(id)
	rw, err := block.FindMode(img, false)
	if err != nil || rw == "" {
		return fmt.Errorf("%w: block volume %s is not staged (no loop device attached; call NodeStageVolume first)", contract.ErrPrecondition, id)
	}
	if singleWriter {
		devs, err := block.Devices(img)
		if err != nil {
			return err
		}
		var srcs []string
		for _, d := range devs {
			srcs = append(srcs, d.Path)
		}
		if err := onlyAt(id, srcs, targetPath); err != nil {
			return err
		}
	}
	if err := prepareDeviceFile(targetPath); err != nil {
		return err
	}
	if !readonly {
		return bindOnce(rw, rw, targetPath, mountFlags{}, false)
	}
	ro, err := block.AttachReadOnly(img)
	if err != nil {
		return err
	}
	if err := bindOnce(ro, ro, targetPath, mountFlags{}, true); err != nil {
		if rerr := releaseReadOnly(img); rerr != nil {
			klog.ErrorS(rerr, "Could not detach an unused read-only loop device", "image", img)
		}
		return err
	}
	return nil
}

// releaseReadOnly detaches the read-only loop device of the image img when
// no mount shows it any more (its last read-only publication is gone).
func releaseReadOnly(img string) error {
	dev, err := block.FindMode(img, true)
	if errors.Is(err, os.ErrNotExist) || (err == nil && dev == "") {
		return nil
	}
	if err != nil {
		return err
	}
	points, _, err := mountsOf(dev)
	if err != nil || len(points) > 0 {
		return err
	}
	if err := block.DetachReadOnly(img); err != nil {
		return err
	}
	klog.V(2).InfoS("Read-only loop device detached: no read-only publication left", "image", img, "device", dev)
	return nil
}

// PublishEphemeral bind-mounts the ephemeral volume v (no staging) onto
// targetPath, created as for Publish. Errors as for Publish.
func (m *Manager) PublishEphemeral(v *contract.Volume, targetPath string, readonly bool, flags []string) error {
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

// prepareDeviceFile makes the target_path p ready to receive a bind mount
// of a device node: a regular file, created when missing (mode 0600; its
// parent must exist). A dead mount on it is removed first. A symlink or a
// directory at p is contract.ErrInvalid. An existing mount is left for bindOnce to
// judge.
func prepareDeviceFile(p string) error {
	if c := filepath.Clean(p); !filepath.IsAbs(p) || c != p {
		return fmt.Errorf("%w: target_path %q must be an absolute, clean path", contract.ErrInvalid, p)
	}
	for i := 0; ; i++ {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
			if errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("%w: parent directory of target_path %q does not exist", contract.ErrInvalid, p)
			}
			if err != nil {
				return fmt.Errorf("create %s: %w", p, err)
			}
			return unix.Close(fd)
		case err != nil && mount.IsCorruptedMnt(err) && i < 64:
			// A dead mount sits on the device file: remove it and look again.
			if err := unmountTop(p); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("lstat %s: %w", p, err)
		case fi.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("%w: target_path %q is a symlink; refusing to mount over it", contract.ErrInvalid, p)
		case fi.IsDir():
			return fmt.Errorf("%w: target_path %q is a directory; a block volume is published as a device file", contract.ErrInvalid, p)
		}
		return nil
	}
}

// Unpublish undoes Publish (CSI NodeUnpublishVolume) for volume id: the
// package-level Unpublish of targetPath, then, when id names a block volume,
// its read-only loop device is detached if no mount shows it any more (its
// last read-only publication is gone). An unknown id is fine (nothing to
// release). Errors: as for Unpublish (contract.ErrPrecondition for a non-empty
// directory that is not a mount).
func (m *Manager) Unpublish(id, targetPath string) error {
	if err := Unpublish(targetPath); err != nil {
		return err
	}
	v, err := m.Resolve(id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if v.AccessType != contract.AccessBlock {
		return nil
	}
	return releaseReadOnly(m.imagePath(v.ID))
}

// Unpublish unmounts targetPath (every stacked mount on it, broken FUSE
// mounts included) and removes it (CSI NodeUnpublishVolume). A missing path
// or one that is not mounted is success; a symlink is removed without being
// followed. It needs no record: it works for volumes the driver no longer
// knows. contract.ErrPrecondition when the path is a non-empty directory that is not
// a mount: that is not ours to delete.
func Unpublish(targetPath string) error {
	if err := cleanupPath(targetPath); err != nil {
		return err
	}
	if err := os.Remove(targetPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("%w: %s is not a mount point and not empty; refusing to remove it", contract.ErrPrecondition, targetPath)
		}
		return fmt.Errorf("remove %s: %w", targetPath, err)
	}
	return nil
}

// cleanupPath unmounts everything mounted on p. A symlink at p is removed
// (never followed); a missing p is fine.
func cleanupPath(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%w: path %q must be absolute", contract.ErrInvalid, p)
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

// checkDir validates a CO-given staging or target path: absolute, clean,
// not a symlink, a directory. With create, a missing last component is made
// (mode 0750); its parent must exist.
func checkDir(p, field string, create bool) error {
	if c := filepath.Clean(p); !filepath.IsAbs(p) || (c != p && c+"/" != p) {
		return fmt.Errorf("%w: %s %q must be an absolute, clean path", contract.ErrInvalid, field, p)
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return fmt.Errorf("%w: %s %q does not exist", contract.ErrInvalid, field, p)
		}
		if err := os.Mkdir(p, 0o750); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: parent directory of %s %q does not exist", contract.ErrInvalid, field, p)
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
		return fmt.Errorf("%w: %s %q is a symlink; refusing to mount over it", contract.ErrInvalid, field, p)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s %q is not a directory", contract.ErrInvalid, field, p)
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

// shows reports whether the path p shows vol: for a directory vol, the same
// device and inode; for a block device node vol, a block device node with
// the same device number (a bind mount of the node, wherever the node
// lives).
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

// bindOnce makes target a bind mount of src, whose content is vol (a
// volume's directory, or a loop device node), with the per-mount flags the
// request asks for (mount flags and readonly, added to what the source
// mount restricts) — or, when target already is a mount, checks that it is
// exactly what this request would have made: it shows vol (the same
// directory, or the same device) with the same flags. Anything else there
// is contract.ErrExists. This is the one check of a repeated stage or publish, for
// mount and block volumes alike (CSI NodeStageVolume / NodePublishVolume:
// "already exists but is incompatible" is ALREADY_EXISTS). The caller has
// made target of the right type (checkDir, prepareDeviceFile).
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
		same, err := shows(target, vol)
		if err != nil {
			return fmt.Errorf("stat %s: %w", target, err)
		}
		if !same {
			return fmt.Errorf("%w: something else is already mounted at %q (another volume or filesystem, or this block volume published with the other readonly)", contract.ErrExists, target)
		}
		actual, err := statfsFlags(target)
		if err != nil {
			return fmt.Errorf("statfs %s: %w", target, err)
		}
		if !mf.matches(actual, inherited, readonly) {
			return fmt.Errorf("%w: volume is already mounted at %q with other flags (readonly or mount_flags differ)", contract.ErrExists, target)
		}
		return nil
	}
	fd, err := openTarget(target, vol)
	if err != nil {
		return fmt.Errorf("%w: open %s: %v", contract.ErrInvalid, target, err)
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

// within reports whether the clean absolute path p is base or below it
// (mount-utils PathWithinBase).
func within(p, base string) bool { return mount.PathWithinBase(p, base) }

// resolved is p with symlinks resolved, as the mount table shows it.
func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}
