package engine

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Names of the engines (--engine, and the engine recorded with each volume).
const (
	Dir   = contract.EngineDir
	Btrfs = contract.EngineBtrfs
	Auto  = contract.EngineAuto
)

// Engine lays out mount volumes (directory trees) on the data root's
// filesystem, at paths pkg/volume builds from validated ids.
type Engine interface {
	// Name is Dir or Btrfs.
	Name() contract.Engine
	// Create makes an empty volume directory at path (which must not exist)
	// with permission mode and a capacity of size bytes.
	Create(path string, size int64, mode uint32) error
	// Snapshot makes a point-in-time, read-only copy of the volume at src,
	// at dst (which must not exist).
	Snapshot(src, dst string) error
	// Clone makes a writable copy of the volume at src at dst with size
	// bytes; a file a pod removes during the copy is left out.
	Clone(src, dst string, size int64) error
	// Restore is Clone from a snapshot at src, which must not change: any
	// entry that vanishes during the copy fails it.
	Restore(src, dst string, size int64) error
	// Resize sets the capacity of the volume at path to size bytes.
	Resize(path string, size int64) error
	// Limit returns the capacity in bytes the kernel enforces on the volume
	// at path (what the last Resize set), or 0 when none is set. dir: 0.
	Limit(path string) (int64, error)
	// Usage returns the bytes the volume at path uses and its inode count
	// (-1 when the engine cannot count inodes cheaply).
	Usage(path string) (bytes, inodes int64, err error)
	// Exclusive returns the bytes only the volume at path holds (freed by
	// deleting it); dir: Usage's figure, shared extents counted as its own.
	Exclusive(path string) (int64, error)
	// Enforced says whether the kernel enforces the capacity (a write past
	// it fails with EDQUOT/ENOSPC).
	Enforced() bool
}

// New returns engine name for the data root (Auto: btrfs when root is on
// btrfs, else dir); btrfs enables quotas if they are off.
func New(name contract.Engine, root string) (Engine, error) {
	switch name {
	case Dir:
		return dirEngine{}, nil
	case Btrfs:
		return newBtrfs(root)
	case Auto, "":
		if onBtrfs(root) {
			return newBtrfs(root)
		}
		return dirEngine{}, nil
	}
	return nil, fmt.Errorf("unknown engine %q (want auto, dir or btrfs)", name)
}

func onBtrfs(p string) bool {
	var s unix.Statfs_t
	return unix.Statfs(p, &s) == nil && s.Type == unix.BTRFS_SUPER_MAGIC
}

// Remove deletes a tree at path made by any engine: a btrfs subvolume with
// its ioctl (read-only snapshots cannot be emptied file by file), else
// os.RemoveAll. A missing path is not an error.
func Remove(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() && isSubvolume(path) {
		return destroySubvolume(path)
	}
	return os.RemoveAll(path)
}

// dirEngine keeps a volume as a plain directory: capacity is tracked by
// pkg/volume, not enforced; snapshots and clones are CopyTree copies.
type dirEngine struct{}

func (dirEngine) Name() contract.Engine { return Dir }
func (dirEngine) Enforced() bool        { return false }

func (dirEngine) Create(path string, _ int64, mode uint32) error {
	if err := unix.Mkdir(path, 0o700); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	return unix.Chmod(path, mode)
}

func (dirEngine) Snapshot(src, dst string) error {
	_, err := CopyTree(src, dst)
	return err
}

func (dirEngine) Clone(src, dst string, _ int64) error {
	_, err := CopyTree(src, dst)
	return err
}

func (dirEngine) Restore(src, dst string, _ int64) error {
	_, err := CopySnapshotTree(src, dst)
	return err
}

func (dirEngine) Resize(string, int64) error { return nil }

func (dirEngine) Limit(string) (int64, error) { return 0, nil }

func (dirEngine) Usage(path string) (int64, int64, error) { return DiskUsage(path) }

// Exclusive is the bytes Usage counts.
func (dirEngine) Exclusive(path string) (int64, error) {
	b, _, err := DiskUsage(path)
	return b, err
}

// ChmodRoot sets the permission bits of the directory at root (opened
// with O_NOFOLLOW: a symlink is never followed).
func ChmodRoot(root string, mode uint32) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", root, err)
	}
	return nil
}
