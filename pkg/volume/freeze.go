package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/volume/block"
)

// FIFREEZE and FITHAW freeze and thaw the filesystem of the mount point
// the ioctl is made on (linux/fs.h: _IOWR('X', 119, int) and
// _IOWR('X', 120, int)). A freeze writes out every dirty page and journal
// entry first and then blocks every write until the thaw.
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// maxFreeze bounds a freeze: a copy still running then loses its
// consistency (the snapshot fails) rather than the pod its writes.
var maxFreeze = 60 * time.Second

// frozenDir is where a freeze is recorded while it lasts,
// <data root>/frozen/<volume_id> holding the mount point, so that a start
// after a crash thaws what the crashed process froze (thawFrozen).
const frozenDir = "frozen"

// whileFrozen runs copy, a copy of volume v's image, with v's filesystem
// frozen when v is a staged image volume (freezeStaged), so the copy holds
// everything written before the call; a raw block volume is copied as it
// is (crash-consistent only if nothing writes). A thaw that fails, or came
// by timeout, fails the copy: it is not consistent.
func (m *Manager) whileFrozen(v *contract.Volume, copy func() error) error {
	thaw := func() error { return nil }
	if v.FsType != "" {
		var err error
		if thaw, err = m.freezeStaged(v); err != nil {
			return err
		}
	}
	err := copy()
	if terr := thaw(); err == nil {
		err = terr
	}
	return err
}

// freezeStaged freezes the filesystem of image volume v where it is
// staged (FIFREEZE on the mount of its read-write loop device) and returns
// the thaw, which is safe to call more than once and runs by itself after
// maxFreeze. A volume that is not attached or not mounted has nothing to
// freeze: the thaw is a no-op. The freeze is recorded durably before it
// is made.
func (m *Manager) freezeStaged(v *contract.Volume) (thaw func() error, err error) {
	nop := func() error { return nil }
	mounts, err := m.imageMounts(v.ID)
	if err != nil || len(mounts) == 0 {
		return nop, err
	}
	mnt := mounts[0]
	marker := filepath.Join(m.root, frozenDir, v.ID)
	if err := writeDurably(marker, mnt); err != nil {
		return nop, fmt.Errorf("record the freeze of %s: %w", mnt, err)
	}
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == nil {
		err = unix.IoctlSetInt(fd, ioctlFIFREEZE, 0)
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		_ = os.Remove(marker)
		return nop, fmt.Errorf("FIFREEZE %s: %w", mnt, err)
	}
	klog.V(4).InfoS("Filesystem frozen for a snapshot", "volumeID", v.ID, "mountpoint", mnt)
	return boundedThaw("the filesystem at "+mnt, marker, func() error {
		err := unix.IoctlSetInt(fd, ioctlFITHAW, 0)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("FITHAW %s: %w", mnt, err)
		}
		klog.V(4).InfoS("Filesystem thawed", "volumeID", v.ID, "mountpoint", mnt)
		return nil
	}), nil
}

// boundedThaw wraps thaw, the end of a freeze of what recorded at marker:
// the result runs thaw once however often it is called, removes the
// record once thaw succeeded, and runs by itself after maxFreeze; a call
// after that fails, since what was frozen was not frozen throughout.
func boundedThaw(what, marker string, thaw func() error) func() error {
	var once sync.Once
	var thawErr error
	var expired atomic.Bool
	var timer *time.Timer
	bounded := func() error {
		once.Do(func() {
			timer.Stop()
			if thawErr = thaw(); thawErr == nil {
				_ = os.Remove(marker)
			}
		})
		if thawErr == nil && expired.Load() {
			return fmt.Errorf("%s was thawed after %s, before the copy ended: the copy is not consistent", what, maxFreeze)
		}
		return thawErr
	}
	timer = time.AfterFunc(maxFreeze, func() {
		klog.InfoS("Thawing what was frozen too long; the snapshot in progress fails", "what", what, "after", maxFreeze)
		expired.Store(true)
		_ = bounded()
	})
	return bounded
}

// imageMounts lists the mount points of the filesystem on image volume
// id's read-write loop device (none when it is not attached or not
// mounted).
func (m *Manager) imageMounts(id string) ([]string, error) {
	dev, err := block.FindMode(m.imagePath(id), false)
	if err != nil || dev == "" {
		return nil, err
	}
	rdev, err := blockdev.Rdev(dev)
	if err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return uint64(unix.Mkdev(uint32(i.Major), uint32(i.Minor))) != rdev, false
	})
	var points []string
	for _, i := range infos {
		points = append(points, i.Mountpoint)
	}
	return points, err
}

// thawFrozen thaws the filesystem of every volume a freeze record names
// (a process killed while it held the freeze), found again by the volume's
// loop device, not by the path recorded, and removes the records. A volume
// no longer attached or mounted has nothing frozen. What cannot be thawed
// is logged and its record kept for the next start: it never stops the
// start.
func (m *Manager) thawFrozen() {
	dir := filepath.Join(m.root, frozenDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		klog.ErrorS(err, "Could not read the freeze records", "dir", dir)
		return
	}
	for _, e := range ents {
		id, p := e.Name(), filepath.Join(dir, e.Name())
		if strings.HasPrefix(id, podFrozenPrefix) {
			if err := m.thawPodRecord(p); err != nil {
				klog.ErrorS(err, "Could not thaw a pod a killed driver left frozen; write THAWED to its freezer.state (cgroup v1) or 0 to its cgroup.freeze (v2)", "record", p)
				continue
			}
			if err := os.Remove(p); err != nil {
				klog.ErrorS(err, "Could not remove a freeze record", "path", p)
			}
			continue
		}
		if !contract.ValidVolumeID(id) {
			klog.ErrorS(nil, "Not a freeze record; left alone", "path", p)
			continue
		}
		if err := m.thawVolume(id); err != nil {
			klog.ErrorS(err, "Could not thaw a filesystem a killed driver left frozen; run fsfreeze --unfreeze on its mount", "volumeID", id)
			continue
		}
		if err := os.Remove(p); err != nil {
			klog.ErrorS(err, "Could not remove a freeze record", "path", p)
		}
	}
}

// thawVolume thaws the filesystem of image volume id through one of its
// mounts (FITHAW; EINVAL: it was not frozen).
func (m *Manager) thawVolume(id string) error {
	mounts, err := m.imageMounts(id)
	if err != nil {
		return err
	}
	var last error
	for _, mnt := range mounts {
		fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			last = err
			continue
		}
		err = unix.IoctlSetInt(fd, ioctlFITHAW, 0)
		unix.Close(fd)
		switch {
		case err == nil:
			klog.InfoS("Thawed a filesystem a killed driver left frozen", "volumeID", id, "mountpoint", mnt)
			return nil
		case errors.Is(err, unix.EINVAL):
			return nil // not frozen
		}
		last = fmt.Errorf("FITHAW %s: %w", mnt, err)
	}
	return last
}

// writeDurably writes content to the new file p and syncs it and its
// directory.
func writeDurably(p, content string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(p))
}
