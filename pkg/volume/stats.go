package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/volume/block"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Usage is what a volume holds, for CSI NodeGetVolumeStats.
type Usage struct {
	// TotalBytes is the volume's capacity in bytes; UsedBytes the space its
	// files occupy (qgroup referenced bytes on btrfs; allocated blocks with
	// hard links counted once on dir; for block volumes the bytes written
	// to the image, its data segments); AvailableBytes = TotalBytes -
	// UsedBytes, never negative.
	TotalBytes, UsedBytes, AvailableBytes int64
	// HasInodes says whether the inode figures are known (not for block
	// volumes, nor on btrfs, which has no inode limit).
	HasInodes bool
	// UsedInodes counts the volume's files and directories (hard links
	// once); FreeInodes is what its filesystem has left; TotalInodes is
	// their sum.
	TotalInodes, UsedInodes, FreeInodes int64
}

// Stats measures volume id (a volume_id or an ephemeral volume's CO id),
// which must be visible at volumePath, its staging or target path as Stage
// and Publish made it: for a mount volume a bind mount of its directory;
// for a block volume a bind mount of one of its loop device nodes (a
// publish path), or a directory holding the staged device node
// <volumePath>/<id> (a staging path). Errors: contract.ErrNotFound for an unknown
// volume, a relative or missing path, or a path that does not show this
// volume (CSI NodeGetVolumeStats: NOT_FOUND, "does not exist on the
// specified volume_path").
func (m *Manager) Stats(id, volumePath string) (Usage, error) {
	v, err := m.Resolve(id)
	if err != nil {
		return Usage{}, err
	}
	if !filepath.IsAbs(volumePath) {
		return Usage{}, fmt.Errorf("%w: volume_path %q is not an absolute path", contract.ErrNotFound, volumePath)
	}
	notHere := fmt.Errorf("%w: volume %s is not mounted at %q", contract.ErrNotFound, id, volumePath)
	if _, err := os.Stat(volumePath); err != nil {
		// Missing, a NUL byte, too long, a dead mount: not found there.
		return Usage{}, fmt.Errorf("%w: volume_path %q: %v", contract.ErrNotFound, volumePath, err)
	}
	if v.AccessType == contract.AccessBlock {
		return m.blockStats(v, volumePath, notHere)
	}
	if v.FsType != "" {
		return m.imageFSStats(v, volumePath, notHere)
	}
	// A mount volume is where a bind mount of its directory is (a staging
	// or publish path); the directory itself, or a copy, is not.
	dir := m.volDir(v.ID)
	same, err := m.mnt.Shows(volumePath, dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !same) {
		return Usage{}, notHere
	}
	if err != nil {
		return Usage{}, fmt.Errorf("stat %s: %w", volumePath, err)
	}
	eng := m.eng
	if v.Engine == engine.Dir && eng.Name() != engine.Dir {
		eng, _ = engine.New(engine.Dir, m.root)
	}
	used, inodes, err := eng.Usage(dir)
	if err != nil {
		return Usage{}, err
	}
	u := Usage{TotalBytes: v.CapacityBytes, UsedBytes: used, AvailableBytes: max(v.CapacityBytes-used, 0)}
	if inodes >= 0 {
		var sfs unix.Statfs_t
		if err := unix.Statfs(dir, &sfs); err != nil {
			return Usage{}, fmt.Errorf("statfs %s: %w", dir, err)
		}
		u.HasInodes = true
		u.UsedInodes, u.FreeInodes = inodes, int64(sfs.Ffree)
		u.TotalInodes = inodes + int64(sfs.Ffree)
	}
	return u, nil
}

// imageFSStats: volumePath must be a mount of image volume v's filesystem
// (its staging path, or a publish bind of it). The figures are the mounted
// filesystem's own (statfs(2)): its total after its metadata, its used and
// available bytes, and its inodes.
func (m *Manager) imageFSStats(v *contract.Volume, volumePath string, notHere error) (Usage, error) {
	if ok, err := m.stagedImage(v, volumePath); err != nil || !ok {
		return Usage{}, notHere
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(volumePath, &sfs); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", volumePath, err)
	}
	bs := sfs.Bsize
	total, free := int64(sfs.Blocks)*bs, int64(sfs.Bfree)*bs
	return Usage{
		TotalBytes: total, UsedBytes: total - free, AvailableBytes: int64(sfs.Bavail) * bs,
		HasInodes: true, TotalInodes: int64(sfs.Files), FreeInodes: int64(sfs.Ffree), UsedInodes: int64(sfs.Files - sfs.Ffree),
	}, nil
}

// blockStats: volumePath must show one of the volume's loop devices the
// way Publish and Stage put it there: a publish path is a bind mount of the
// read-write or the read-only device node; a staging path is a directory
// holding the device node <volumePath>/<id> of the read-write device.
// Anything else — an empty directory, the /dev node itself, a mount of
// another device — is notHere, even while the volume is attached.
func (m *Manager) blockStats(v *contract.Volume, volumePath string, notHere error) (Usage, error) {
	img := m.imagePath(v.ID)
	devs, err := block.Devices(img)
	if err != nil || len(devs) == 0 {
		return Usage{}, notHere
	}
	var st unix.Stat_t
	if err := unix.Stat(volumePath, &st); err != nil {
		return Usage{}, notHere
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if !isDeviceOf(stagedDevicePath(volumePath, v.ID), devs, true) {
			return Usage{}, notHere
		}
	} else if isMnt, err := m.mnt.IsMountPoint(volumePath); err != nil || !isMnt || !isDeviceOf(volumePath, devs, false) {
		return Usage{}, notHere
	}
	used, err := writtenBytes(img)
	if err != nil {
		return Usage{}, err
	}
	used = min(used, v.CapacityBytes)
	return Usage{TotalBytes: v.CapacityBytes, UsedBytes: used, AvailableBytes: v.CapacityBytes - used}, nil
}

// isDeviceOf reports whether p (not followed when it is a symlink) is a
// block device node of one of devs (only the read-write one when rwOnly).
func isDeviceOf(p string, devs []block.Device, rwOnly bool) bool {
	for _, d := range devs {
		if rwOnly && d.ReadOnly {
			continue
		}
		if ok, err := blockdev.NodeOf(p, d.Path); err == nil && ok {
			return true
		}
	}
	return false
}

// writtenBytes sums the data segments of the image at path (SEEK_DATA /
// SEEK_HOLE): what was written through the device. Its allocated blocks
// (st_blocks) would count the preallocated, never written ranges too,
// which SEEK_DATA reports as holes. A filesystem without SEEK_DATA reports
// the whole file as data.
func writtenBytes(path string) (int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	var n int64
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return 0, err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return 0, err
		}
		n += hole - data
		off = hole
	}
	return n, nil
}
