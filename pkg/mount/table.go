package mount

import (
	"fmt"
	"path/filepath"
	"strings"

	mountutils "k8s.io/mount-utils"
)

const mountInfoPath = "/proc/self/mountinfo"

// MountPoints implements Interface (mount-utils GetMountRefs: the mounts
// with src's device and src's path inside its filesystem as their root).
func (*Mounter) MountPoints(src string) ([]string, error) {
	return table.GetMountRefs(src)
}

// InUse implements Interface. Unlike GetMountRefs it also counts a mount
// of a part of dir (a pod's subPath bind-mounts a subdirectory of the
// published volume) and a mount inside dir: deleting dir would pull the
// data from under either.
func (*Mounter) InUse(dir string) (bool, error) {
	mis, err := mountutils.ParseMountInfo(mountInfoPath)
	if err != nil {
		return false, fmt.Errorf("read mount table: %w", err)
	}
	host, rootInFS, ok := hostOf(mis, dir)
	if !ok {
		return false, fmt.Errorf("no mount contains %s", dir)
	}
	for _, mi := range mis {
		if mi.MountPoint == dir {
			continue
		}
		if mi.Major == host.Major && mi.Minor == host.Minor && mountutils.PathWithinBase(mi.Root, rootInFS) {
			return true, nil
		}
		if mountutils.PathWithinBase(mi.MountPoint, dir) {
			return true, nil
		}
	}
	return false, nil
}

// hostOf finds the mount that p is on, as mount-utils' SearchMountPoints
// does: the last (topmost, as later mounts overlay earlier ones) mount whose
// mount point is p or above it; rootInFS is p's path inside that mount's
// filesystem.
func hostOf(mis []mountutils.MountInfo, p string) (host mountutils.MountInfo, rootInFS string, ok bool) {
	for i := len(mis) - 1; i >= 0; i-- {
		if mountutils.PathWithinBase(p, mis[i].MountPoint) {
			return mis[i], filepath.Join(mis[i].Root, strings.TrimPrefix(p, mis[i].MountPoint)), true
		}
	}
	return mountutils.MountInfo{}, "", false
}
