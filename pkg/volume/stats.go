package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Usage is what a volume holds, for CSI NodeGetVolumeStats.
type Usage struct {
	// TotalBytes is the volume's capacity in bytes; UsedBytes the space its
	// files occupy (allocated blocks, hard links counted once);
	// AvailableBytes = TotalBytes - UsedBytes, never negative.
	TotalBytes, UsedBytes, AvailableBytes int64
	// UsedInodes counts the volume's files and directories (hard links
	// once); FreeInodes is what its filesystem has left; TotalInodes is
	// their sum.
	TotalInodes, UsedInodes, FreeInodes int64
	// Condition is abnormal when usage exceeds the capacity (the dir engine
	// tracks, but does not enforce, capacity).
	Condition Condition
}

// Stats measures volume id, which must be mounted at volumePath (its staging
// or target path). Errors: ErrNotFound for an unknown volume, a relative or
// missing path, or a path that does not show this volume.
func (m *Manager) Stats(id, volumePath string) (Usage, error) {
	v, err := m.Get(id)
	if err != nil {
		return Usage{}, err
	}
	if !filepath.IsAbs(volumePath) {
		return Usage{}, fmt.Errorf("%w: volume_path %q is not an absolute path", ErrNotFound, volumePath)
	}
	dir := m.volDir(id)
	same, err := sameFile(volumePath, dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !same) {
		return Usage{}, fmt.Errorf("%w: volume %s is not mounted at %q", ErrNotFound, id, volumePath)
	}
	if err != nil {
		return Usage{}, fmt.Errorf("stat %s: %w", volumePath, err)
	}
	used, inodes, err := diskUsage(dir)
	if err != nil {
		return Usage{}, err
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	u := Usage{
		TotalBytes:  v.CapacityBytes,
		UsedBytes:   used,
		UsedInodes:  inodes,
		FreeInodes:  int64(sfs.Ffree),
		TotalInodes: inodes + int64(sfs.Ffree),
	}
	u.AvailableBytes = max(v.CapacityBytes-used, 0)
	if used > v.CapacityBytes {
		u.Condition = Condition{Abnormal: true, Message: fmt.Sprintf("volume uses %d bytes, more than its capacity of %d bytes", used, v.CapacityBytes)}
	} else {
		u.Condition = Condition{Message: "volume is healthy"}
	}
	return u, nil
}

// diskUsage walks dir without following symlinks and sums allocated bytes
// (st_blocks × 512) and inodes, counting each hard-linked inode once. It
// stays on dir's filesystem.
func diskUsage(dir string) (bytes, inodes int64, err error) {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		return 0, 0, err
	}
	seen := map[uint64]bool{}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, werr error) error {
		if werr != nil {
			if errors.Is(werr, os.ErrNotExist) {
				return nil // removed while we walk
			}
			return werr
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if st.Dev != root.Dev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		bytes += st.Blocks * 512
		inodes++
		return nil
	})
	return bytes, inodes, err
}
