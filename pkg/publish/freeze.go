package publish

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
	"github.com/localdir-csi/localdir/pkg/publish/cgroup"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
)

// FIFREEZE and FITHAW (linux/fs.h): a freeze writes out every dirty page and
// journal entry, then blocks every write to the filesystem until the thaw.
const (
	ioctlFIFREEZE = 0xc0045877
	ioctlFITHAW   = 0xc0045878
)

// maxFreeze bounds a freeze: a copy still running then loses its
// consistency (the snapshot fails) rather than the pod its writes.
var maxFreeze = 60 * time.Second

// frozenDir records each freeze while it lasts (<volume_id>: its image path;
// pod-<uid>: the pod's freezer cgroup), so a start after a crash thaws it.
const frozenDir = "frozen"

// Freeze freezes the filesystem of image volume v where it is staged
// (FIFREEZE on a mount of its read-write loop device), recording the freeze
// durably first, and returns the thaw (boundedThaw). Not attached or not
// mounted: nothing to freeze, the thaw is a no-op.
func (pb *Publisher) Freeze(v *contract.Volume) (thaw func() error, err error) {
	nop := func() error { return nil }
	img := pb.vols.ImagePath(v.ID)
	mounts, err := imageMounts(img)
	if err != nil || len(mounts) == 0 {
		return nop, err
	}
	mnt := mounts[0]
	marker := filepath.Join(pb.root, frozenDir, v.ID)
	if err := writeDurably(marker, img); err != nil {
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

// boundedThaw wraps thaw, the end of the freeze recorded at marker: it runs
// thaw once however often called, removes the record once thaw succeeded, and
// runs by itself after maxFreeze, after which a call fails (not consistent).
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

// imageMounts lists the mount points of the filesystem on image file img's
// read-write loop device.
func imageMounts(img string) ([]string, error) {
	dev, err := loop.FindMode(img, false)
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

// ThawFrozen thaws what the freeze records under dataRoot name (a process
// killed while frozen): volumes' filesystems and pods' freezer cgroups under
// cgroupRoot. What cannot be thawed is logged and kept for the next start,
// never stopping this one; it runs first, before the state file is opened.
func ThawFrozen(dataRoot, cgroupRoot string) {
	dir := filepath.Join(dataRoot, frozenDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		klog.ErrorS(err, "Could not read the freeze records", "dir", dir)
		return
	}
	var cg *cgroup.Hierarchy
	if cgroupRoot != "" {
		if cg, err = cgroup.Open(cgroupRoot); err != nil {
			klog.ErrorS(err, "No cgroup hierarchy: frozen pods cannot be thawed", "cgroupRoot", cgroupRoot)
		}
	}
	for _, e := range ents {
		id, p := e.Name(), filepath.Join(dir, e.Name())
		if strings.HasPrefix(id, podFrozenPrefix) {
			if err := thawPodRecord(cg, p); err != nil {
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
		b, err := os.ReadFile(p)
		if err == nil {
			err = thawVolume(strings.TrimSpace(string(b)), id)
		}
		if err != nil {
			klog.ErrorS(err, "Could not thaw a filesystem a killed driver left frozen; run fsfreeze --unfreeze on its mount", "volumeID", id)
			continue
		}
		if err := os.Remove(p); err != nil {
			klog.ErrorS(err, "Could not remove a freeze record", "path", p)
		}
	}
}

// thawVolume thaws image volume id's filesystem through one of its mounts
// (EINVAL: not frozen). img comes from a freeze record: it must be id's image.
func thawVolume(img, id string) error {
	if filepath.Base(img) != id+".img" || !filepath.IsAbs(img) {
		return fmt.Errorf("freeze record of %s names %q, not its image", id, img)
	}
	mounts, err := imageMounts(img)
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
	d, err := os.Open(filepath.Dir(p))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
