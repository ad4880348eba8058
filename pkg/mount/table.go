package mount

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/blockdev"
)

const mountInfoPath = "/proc/self/mountinfo"

// The mount table is read with mount-utils' ParseMountInfo and paths are
// compared with its PathWithinBase. mount-utils' GetMountRefs and
// SearchMountPoints are not used: they take the mount holding a path to be
// the last mountinfo entry above it, which is wrong where the root mount is
// listed after /dev (containers; this project's CI machine): every device
// node would then seem to be on "/" and never bind-mounted anywhere.
// hostOf takes the longest mount point above the path instead.

// MountPoints implements Interface: the mounts of src's filesystem whose
// root is src's path in it or below it (a bind mount of src, or of a part
// of it), src itself excepted.
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

// InUse implements Interface. It also counts a mount of a part of dir (a
// pod's subPath bind-mounts a subdirectory of the published volume) and a
// mount inside dir: deleting dir would pull the data from under either.
func (*Mounter) InUse(dir string) (bool, error) {
	points, nested, err := mountsOf(dir)
	return len(points) > 0 || nested, err
}

// mountsOf returns the mount points that show p or a part of it, read from
// /proc/self/mountinfo: a bind mount of p has the device of p's filesystem
// and a root at or below p's path inside that filesystem. nested reports a
// mount below p.
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

// hostOf finds the mount that p is on: the longest mount point at or above
// it, the topmost (latest) of stacked ones; rootInFS is p's path inside
// that mount's filesystem.
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
