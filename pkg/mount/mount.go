// Package mount does the node mount operations on the paths the CO gives:
// bind mounts with per-mount flags, unmounting, the mount table (via
// k8s.io/mount-utils), mount-flag parsing, path safety checks and device
// nodes. It knows nothing of volumes: pkg/publish decides what to mount.
//
// State is always read from the mount table, never from records, so a reboot,
// a manual unmount or a crash is seen as it is. Mounts use mount(2), not a
// fork+exec of mount(8) (`make bench`), on /proc/self/fd/N of the target
// opened O_PATH|O_NOFOLLOW, so a symlink swapped in at the last component
// never redirects a mount (CVE-2017-1002101 / CVE-2021-25741 class).
package mount

// Interface is the node's mount operations: Mounter on this mount namespace,
// Fake for unit tests. Errors for caller mistakes or conflicts wrap the
// pkg/contract sentinels.
type Interface interface {
	// PrepareDir validates a CO-given path p (named field in errors):
	// absolute, clean, not a symlink, a directory, made (0750) with create
	// when missing; a dead (ENOTCONN) mount on it is removed. ErrInvalid.
	PrepareDir(p, field string, create bool) error
	// PrepareFile makes target_path p a regular file (0600) to bind a device
	// node onto; a symlink or directory there is contract.ErrInvalid.
	PrepareFile(p string) error
	// Bind makes b.Target a bind mount of b.From (else b.Source) with b's
	// flags or, when b.Target already is a mount, checks it is exactly what b
	// would make; anything else is contract.ErrExists (CSI ALREADY_EXISTS).
	// The caller has prepared b.Target (PrepareDir, PrepareFile).
	Bind(b Bind) error
	// Unmount removes every mount stacked on p (broken FUSE ones lazily); a
	// symlink is removed, not followed. contract.ErrPrecondition when busy.
	Unmount(p string) error
	// Remove is Unmount, then removes p (NodeUnpublishVolume);
	// contract.ErrPrecondition for a non-empty directory that is no mount.
	Remove(p string) error
	// PlaceDevice makes p a block device node (0600) of dev's number,
	// replacing a stale one; anything else at p is contract.ErrExists.
	PlaceDevice(p, dev string) error
	// RemoveDevice removes the block device node p; anything else there is
	// left alone.
	RemoveDevice(p string) error
	// HasDevice reports whether p is a block device node of dev's number.
	HasDevice(p, dev string) (bool, error)
	// IsMountPoint reports whether p is a mount point (os.ErrNotExist when
	// p does not exist).
	IsMountPoint(p string) (bool, error)
	// Shows reports whether p is a mount point showing src (the same inode,
	// or for a device node the same device number).
	Shows(p, src string) (bool, error)
	// MountPoints lists the mount points that show src (a directory or a
	// device node) or a part of it: who else holds it.
	MountPoints(src string) ([]string, error)
	// FormatAndMount mounts dev's fsType filesystem at target, formatting dev
	// only when it holds none (mkfs gets formatOptions as well); a repeat is
	// success, any other mount there contract.ErrExists, another filesystem
	// on dev an error.
	FormatAndMount(dev, target, fsType string, options, formatOptions []string) error
	// HoldsFS reports whether p is a mount point of the filesystem on the
	// block device dev (os.ErrNotExist when p does not exist).
	HoldsFS(p, dev string) (bool, error)
	// FSMountPoints lists the mount points of the filesystem on the block
	// device dev (its mounts and every bind mount of a part of it).
	FSMountPoints(dev string) ([]string, error)
	// ResizeFS grows the filesystem on dev, mounted at mountPath, to the
	// device's size when it is smaller (online).
	ResizeFS(dev, mountPath string) error
	// InUse reports whether dir, or a part of it (a subPath), is mounted
	// anywhere in this namespace, or has a mount inside it.
	InUse(dir string) (bool, error)
}

// Bind is one bind mount (Interface.Bind).
type Bind struct {
	// Source is what the mount must show: a volume's directory or a block
	// device node.
	Source string
	// From is the path bound (a staging path showing Source); "": Source.
	From string
	// Target is the CO-given path mounted on.
	Target string
	// Flags are the parsed mount flags (ParseFlags).
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
