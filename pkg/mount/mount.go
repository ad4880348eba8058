// Package mount owns the node mount operations on the paths the CO gives
// (staging_target_path, target_path): bind mounts of a volume's data with
// per-mount flags and read-only, unmounting, what is mounted where and who
// else holds it (read from the mount table with k8s.io/mount-utils),
// mount-flag parsing, the path safety checks and the device nodes of staged
// block volumes. It knows nothing of volumes, records or loop devices:
// pkg/volume decides what to mount (a volume's directory, a loop device
// node) under its per-volume lock and holds, and asks an Interface to do it.
//
// Staged and published state is always read from the mount table
// (mountinfo, statfs, stat), never from records, so a reboot, an unmount by
// hand or a driver crash between calls is seen as it is.
//
// Mounts are made with mount(2) directly, not by exec'ing mount(8) (which is
// what mount-utils' Mounter.Mount does): a bind mount is one syscall (~20 µs)
// while mount(8) costs a fork+exec (~2–5 ms) per call; see the node-cycle
// figures of `make bench`. The mount target is opened with
// O_PATH|O_NOFOLLOW first and the mount made on /proc/self/fd/N, so a
// symlink swapped in at the last path component can never redirect a mount
// (CVE-2017-1002101 / CVE-2021-25741 class). Nothing outside the data root
// and the CO-given paths is created, changed or removed.
package mount

// Interface is the node's mount operations. Mounter does them on this
// node's mount namespace; Fake keeps an in-memory mount table for unit tests
// that run without root. Every error for a caller mistake or a state
// conflict wraps one of the pkg/contract sentinels.
type Interface interface {
	// PrepareDir validates a CO-given staging or target path p (named field
	// in errors): absolute, clean, not a symlink, a directory. With create
	// a missing last component is made (mode 0750; its parent must exist).
	// A dead (ENOTCONN) mount on p is removed first. Errors:
	// contract.ErrInvalid.
	PrepareDir(p, field string, create bool) error
	// PrepareFile makes the target_path p ready to receive a bind mount of
	// a device node: a regular file, created when missing (mode 0600; its
	// parent must exist). A symlink or a directory at p is
	// contract.ErrInvalid; an existing mount is left for Bind to judge.
	PrepareFile(p string) error
	// Bind makes b.Target a bind mount of b.From (b.Source when empty) with
	// b's flags, or, when b.Target already is a mount, checks that it is
	// exactly what b would have made: it shows b.Source (the same
	// directory, or the same device) with the same per-mount flags.
	// Anything else there is contract.ErrExists. This is the one check of a
	// repeated stage or publish, for mount and block volumes alike (CSI:
	// "already exists but is incompatible" is ALREADY_EXISTS). The caller
	// has made b.Target of the right type (PrepareDir, PrepareFile).
	Bind(b Bind) error
	// Unmount removes every mount stacked on p (broken FUSE mounts
	// included, lazily). A symlink at p is removed, never followed; a
	// missing p is fine. contract.ErrPrecondition when p is busy.
	Unmount(p string) error
	// Remove is Unmount, then p itself is removed (CSI
	// NodeUnpublishVolume). contract.ErrPrecondition when p is a non-empty
	// directory that is not a mount: that is not ours to delete.
	Remove(p string) error
	// PlaceDevice makes p a block device node (mode 0600) with the device
	// number of the device node dev. A node of another device number there
	// is stale and replaced; anything else at p is contract.ErrExists.
	PlaceDevice(p, dev string) error
	// RemoveDevice removes the block device node p; anything else there is
	// left alone.
	RemoveDevice(p string) error
	// HasDevice reports whether p is a block device node with the device
	// number of the device node dev (what PlaceDevice made); a missing p
	// is false.
	HasDevice(p, dev string) (bool, error)
	// IsMountPoint reports whether p is a mount point (os.ErrNotExist when
	// p does not exist).
	IsMountPoint(p string) (bool, error)
	// Shows reports whether p is a mount point showing src: for a directory
	// src the same device and inode, for a device node src a block device
	// node of the same device number.
	Shows(p, src string) (bool, error)
	// MountPoints lists the mount points that show src (a directory or a
	// device node) or a part of it: who else holds it.
	MountPoints(src string) ([]string, error)
	// FormatAndMount mounts the filesystem fsType on the block device dev
	// at the directory target with the mount options, formatting dev first
	// when it holds no filesystem at all (never one that holds data). A
	// target that already holds dev's filesystem is success (a repeated
	// stage); any other mount there is contract.ErrExists. A device
	// holding another filesystem than fsType fails.
	FormatAndMount(dev, target, fsType string, options []string) error
	// HoldsFS reports whether p is a mount point of the filesystem on the
	// block device dev (os.ErrNotExist when p does not exist).
	HoldsFS(p, dev string) (bool, error)
	// FSMountPoints lists the mount points of the filesystem on the block
	// device dev (its mounts and every bind mount of a part of it).
	FSMountPoints(dev string) ([]string, error)
	// ResizeFS grows the filesystem on dev, mounted at mountPath, to the
	// device's size when it is smaller (online).
	ResizeFS(dev, mountPath string) error
	// InUse reports whether the directory dir is shown by a mount anywhere
	// in this mount namespace (dir itself or a part of it, e.g. a subPath),
	// or has a mount inside it.
	InUse(dir string) (bool, error)
}

// Bind is one bind mount (Interface.Bind).
type Bind struct {
	// Source is what the mount must show: a volume's directory or a block
	// device node.
	Source string
	// From is the path bound (a staging path showing Source); empty means
	// Source.
	From string
	// Target is the CO-given path mounted on.
	Target string
	// Flags are the parsed mount flags (ParseFlags), added to what the
	// source mount restricts.
	Flags Flags
	// ReadOnly makes the mount read-only.
	ReadOnly bool
}

func (b Bind) from() string {
	if b.From == "" {
		return b.Source
	}
	return b.From
}

// Mounter is the Interface on this node's mount namespace.
type Mounter struct{}

// New returns the real Interface.
func New() *Mounter { return &Mounter{} }

var _ Interface = (*Mounter)(nil)
