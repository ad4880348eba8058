package publish

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
)

// Stats measures volume id (or an ephemeral volume's CO id), which volumePath
// must show as Stage or Publish made it. contract.ErrNotFound for an unknown
// volume or a path that does not show it (CSI NodeGetVolumeStats: "does not
// exist on the specified volume_path").
func (pb *Publisher) Stats(id, volumePath string) (contract.Usage, error) {
	v, err := pb.vols.Resolve(id)
	if err != nil {
		return contract.Usage{}, err
	}
	if !filepath.IsAbs(volumePath) {
		return contract.Usage{}, fmt.Errorf("%w: volume_path %q is not an absolute path", contract.ErrNotFound, volumePath)
	}
	notHere := fmt.Errorf("%w: volume %s is not mounted at %q", contract.ErrNotFound, id, volumePath)
	if _, err := os.Stat(volumePath); err != nil {
		// Missing, a NUL byte, too long, a dead mount: not found there.
		return contract.Usage{}, fmt.Errorf("%w: volume_path %q: %v", contract.ErrNotFound, volumePath, err)
	}
	if v.AccessType == contract.AccessBlock {
		return pb.blockStats(v, volumePath, notHere)
	}
	if v.FsType != "" {
		return pb.imageFSStats(v, volumePath, notHere)
	}
	// A mount volume is where a bind mount of its directory is (a staging
	// or publish path); the directory itself, or a copy, is not.
	dir := pb.vols.DataPath(v)
	same, err := pb.mnt.Shows(volumePath, dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !same) {
		return contract.Usage{}, notHere
	}
	if err != nil {
		return contract.Usage{}, fmt.Errorf("stat %s: %w", volumePath, err)
	}
	used, inodes, err := pb.vols.Usage(v)
	if err != nil {
		return contract.Usage{}, err
	}
	u := contract.Usage{TotalBytes: v.CapacityBytes, UsedBytes: used, AvailableBytes: max(v.CapacityBytes-used, 0)}
	if inodes >= 0 {
		var sfs unix.Statfs_t
		if err := unix.Statfs(dir, &sfs); err != nil {
			return contract.Usage{}, fmt.Errorf("statfs %s: %w", dir, err)
		}
		u.HasInodes = true
		u.UsedInodes, u.FreeInodes = inodes, int64(sfs.Ffree)
		u.TotalInodes = inodes + int64(sfs.Ffree)
	}
	return u, nil
}

// imageFSStats: volumePath must mount image volume v's filesystem; the figures
// are that filesystem's own (statfs(2)).
func (pb *Publisher) imageFSStats(v *contract.Volume, volumePath string, notHere error) (contract.Usage, error) {
	if ok, err := pb.stagedImage(v, volumePath); err != nil || !ok {
		return contract.Usage{}, notHere
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(volumePath, &sfs); err != nil {
		return contract.Usage{}, fmt.Errorf("statfs %s: %w", volumePath, err)
	}
	bs := sfs.Bsize
	total, free := int64(sfs.Blocks)*bs, int64(sfs.Bfree)*bs
	return contract.Usage{
		TotalBytes: total, UsedBytes: total - free, AvailableBytes: int64(sfs.Bavail) * bs,
		HasInodes: true, TotalInodes: int64(sfs.Files), FreeInodes: int64(sfs.Ffree), UsedInodes: int64(sfs.Files - sfs.Ffree),
	}, nil
}

// blockStats: volumePath must show one of the volume's loop devices as
// Publish (a bind of a device node) or Stage (a directory holding
// <volumePath>/<id>) put it; anything else is notHere, even while attached.
func (pb *Publisher) blockStats(v *contract.Volume, volumePath string, notHere error) (contract.Usage, error) {
	img := pb.vols.ImagePath(v.ID)
	devs, err := loop.Devices(img)
	if err != nil || len(devs) == 0 {
		return contract.Usage{}, notHere
	}
	var st unix.Stat_t
	if err := unix.Stat(volumePath, &st); err != nil {
		return contract.Usage{}, notHere
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if !isDeviceOf(stagedDevicePath(volumePath, v.ID), devs, true) {
			return contract.Usage{}, notHere
		}
	} else if isMnt, err := pb.mnt.IsMountPoint(volumePath); err != nil || !isMnt || !isDeviceOf(volumePath, devs, false) {
		return contract.Usage{}, notHere
	}
	used, err := writtenBytes(img)
	if err != nil {
		return contract.Usage{}, err
	}
	used = min(used, v.CapacityBytes)
	return contract.Usage{TotalBytes: v.CapacityBytes, UsedBytes: used, AvailableBytes: v.CapacityBytes - used}, nil
}

// isDeviceOf reports whether p (not followed when it is a symlink) is a
// block device node of one of devs (only the read-write one when rwOnly).
func isDeviceOf(p string, devs []loop.Device, rwOnly bool) bool {
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

// writtenBytes sums the image's data segments (SEEK_DATA/SEEK_HOLE): what was
// written. st_blocks would count preallocated, never written ranges too.
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
