package mount

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/blockdev"
)

const mountInfoPath = "/proc/self/mountinfo"

// mount-utils' GetMountRefs and SearchMountPoints are not used: they take the
// mount holding a path to be the last mountinfo entry above it, wrong where
// the root mount is listed after /dev (containers, this project's CI), where
// no device node would seem bind-mounted. hostOf takes the longest match.

// MountPoints implements Interface: mounts of src's filesystem rooted at or
// below src's path in it, src itself excepted.
func (*Mounter) MountPoints(src string) ([]string, error) {
	points, _, err := mountsOf(src)
	return points, err
}

// FSMountPoints implements Interface: the mountinfo entries whose device
// number is dev's (st_rdev of the device node).
func (*Mounter) FSMountPoints(dev string) ([]string, error) {
	rdev, err := blockdev.Rdev(dev)
	if err != nil {
		return nil, err
	}
	mis, err := mountutils.ParseMountInfo(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	var points []string
	for _, mi := range mis {
		if uint32(mi.Major) == unix.Major(rdev) && uint32(mi.Minor) == unix.Minor(rdev) {
			points = append(points, mi.MountPoint)
		}
	}
	return points, nil
}

// InUse implements Interface, counting a mount of a part of dir (a subPath)
// and one inside dir: deleting dir would pull the data from under either.
func (*Mounter) InUse(dir string) (bool, error) {
	points, nested, err := mountsOf(dir)
	return len(points) > 0 || nested, err
}

// mountsOf returns the mount points showing p or a part of it (same device, a
// root at or below p's path); nested reports a mount below p.
func mountsOf(p string) (points []string, nested bool, err error) {
	mis, err := mountutils.ParseMountInfo(mountInfoPath)
	if err != nil {
		return nil, false, fmt.Errorf("read mount table: %w", err)
	}
	host, rootInFS, ok := hostOf(mis, p)
	if !ok {
		return nil, false, fmt.Errorf("no mount contains %s", p)
	}
	for _, mi := range mis {
		if mi.MountPoint == p {
			continue
		}
		if mi.Major == host.Major && mi.Minor == host.Minor && mountutils.PathWithinBase(mi.Root, rootInFS) {
			points = append(points, mi.MountPoint)
		}
		if mountutils.PathWithinBase(mi.MountPoint, p) {
			nested = true
		}
	}
	return points, nested, nil
}

// hostOf finds the mount p is on (the longest mount point above it, the top
// of stacked ones) and p's path inside its filesystem.
func hostOf(mis []mountutils.MountInfo, p string) (host mountutils.MountInfo, rootInFS string, ok bool) {
	for _, mi := range mis {
		if mountutils.PathWithinBase(p, mi.MountPoint) && (!ok || len(mi.MountPoint) >= len(host.MountPoint)) {
			host, ok = mi, true
		}
	}
	if !ok {
		return host, "", false
	}
	rel, err := filepath.Rel(host.MountPoint, p)
	if err != nil {
		return host, "", false
	}
	return host, filepath.Join(host.Root, rel), true
}
