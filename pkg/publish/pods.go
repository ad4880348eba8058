package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish/cgroup"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
	"github.com/localdir-csi/localdir/pkg/state"
)

// The pods that use a volume: NodePublishVolume names the pod (volume_context
// csi.storage.k8s.io/pod.uid, CSIDriver podInfoOnMount), recorded as a
// state.Publication until NodeUnpublishVolume. Its cgroups carry an image
// volume's I/O limits and are frozen for group snapshots.

// pods is the Publisher's part that deals with the pods that use volumes:
// their publications' records, their cgroups' I/O limits and freezes.
type pods struct{ *Publisher }

// RunIOLimits keeps the I/O limits of published image volumes on their
// pods' cgroups until ctx ends (pods.runIOLimits).
func (pb *Publisher) RunIOLimits(ctx context.Context) { pb.pods.runIOLimits(ctx) }

// recordPublication records volume v's publication for pod o.PodUID (none
// without one) and applies the volume's I/O limits to that pod.
func (pb pods) recordPublication(v *contract.Volume, o contract.PublishOptions) error {
	if o.PodUID == "" {
		return nil
	}
	p := &state.Publication{VolumeID: v.ID, TargetPath: o.TargetPath, StagingPath: o.StagingPath, PodUID: o.PodUID}
	if err := pb.vols.PutPublication(p); err != nil {
		return err
	}
	if l := contract.IOLimitsOf(v.MutableParameters); l != (contract.IOLimits{}) {
		if err := pb.setPodIO(v, o.PodUID, l); err != nil {
			return err
		}
		pb.kickIOLimits()
	}
	return nil
}

// forgetPublication removes that record and takes the volume's I/O limits off
// the pod's cgroups when it was the pod's last publication of it.
func (pb pods) forgetPublication(v *contract.Volume, targetPath string) error {
	p, err := pb.vols.Publication(v.ID, targetPath)
	if err != nil || p == nil {
		return err
	}
	rest, err := pb.vols.Publications(v.ID)
	if err != nil {
		return err
	}
	same := 0
	for _, r := range rest {
		if r.PodUID == p.PodUID {
			same++
		}
	}
	if same == 1 && contract.IOLimitsOf(v.MutableParameters) != (contract.IOLimits{}) {
		if err := pb.setPodIO(v, p.PodUID, contract.IOLimits{}); err != nil {
			return err
		}
	}
	return pb.vols.DeletePublication(v.ID, targetPath)
}

// applyIOLimits sets the I/O limits of params on the cgroups of every pod v
// is published for; gone pods are skipped.
func (pb pods) applyIOLimits(v *contract.Volume, params map[string]string) error {
	pubs, err := pb.vols.Publications(v.ID)
	if err != nil {
		return err
	}
	l := contract.IOLimitsOf(params)
	for _, p := range pubs {
		if err := pb.setPodIO(v, p.PodUID, l); err != nil {
			return err
		}
	}
	if len(pubs) > 0 {
		pb.kickIOLimits()
	}
	return nil
}

// setPodIO sets l on pod uid's cgroups for every loop device of image volume
// v. A pod without a cgroup (gone), or a node without a hierarchy
// (--cgroup-root=, logged), is nothing to do.
func (pb pods) setPodIO(v *contract.Volume, uid string, l contract.IOLimits) error {
	if !v.Image() {
		return nil
	}
	if pb.cg == nil {
		if l != (contract.IOLimits{}) {
			klog.ErrorS(nil, "Volume has I/O limits, but this node plugin runs with --cgroup-root= (off): they are not applied", "volumeID", v.ID, "podUID", uid)
		}
		return nil
	}
	devs, err := loop.Devices(pb.vols.ImagePath(v.ID))
	if err != nil {
		return err
	}
	var nums []uint64
	for _, d := range devs {
		n, err := blockdev.Rdev(d.Path)
		if err != nil {
			return err
		}
		nums = append(nums, n)
	}
	if len(nums) == 0 {
		return nil
	}
	dirs, err := pb.cg.SetIO(uid, nums, cgroup.Limits(l))
	if errors.Is(err, cgroup.ErrNoPod) {
		klog.V(2).InfoS("No cgroup of the pod a volume is published for; its I/O limits wait for it", "volumeID", v.ID, "podUID", uid)
		return nil
	}
	if err != nil {
		return fmt.Errorf("set the I/O limits of volume %s for pod %s: %w", v.ID, uid, err)
	}
	klog.V(4).InfoS("I/O limits set", "volumeID", v.ID, "podUID", uid, "limits", l, "cgroups", dirs)
	return nil
}

// ioResync is how often RunIOLimits sets every limit again, besides when a
// pod's cgroup gains a container.
var ioResync = 30 * time.Second

// kickIOLimits asks RunIOLimits to look again at once (it may not run).
func (pb pods) kickIOLimits() {
	select {
	case pb.ioKick <- struct{}{}:
	default:
	}
}

// runIOLimits keeps the I/O limits of published image volumes on their pods'
// cgroups until ctx ends: on cgroup v1 a limit binds only the cgroup written,
// so each container the kubelet starts in a limited pod (inotify) gets it at
// once; on v2 the pod's io.max covers them. Everything is resynced every 30 s.
func (pb pods) runIOLimits(ctx context.Context) {
	if pb.cg == nil {
		return
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		klog.ErrorS(err, "No inotify watcher: the I/O limits of new containers are set by the periodic resync only")
	}
	var events chan fsnotify.Event
	watched := map[string]bool{}
	if w != nil {
		defer w.Close()
		events = w.Events
		go func() {
			for err := range w.Errors {
				klog.ErrorS(err, "inotify watch of pod cgroups")
			}
		}()
	}
	t := time.NewTicker(ioResync)
	defer t.Stop()
	for {
		dirs := pb.syncIOLimits(ctx)
		if w != nil {
			for d := range watched {
				if !dirs[d] {
					_ = w.Remove(d)
					delete(watched, d)
				}
			}
			added := false
			for d := range dirs {
				if !watched[d] {
					if err := w.Add(d); err == nil {
						watched[d], added = true, true
					}
				}
			}
			if added {
				// A container made between the sync and the new watch.
				pb.syncIOLimits(ctx)
			}
		}
		if !pb.waitIOEvent(ctx, t.C, events) {
			return
		}
	}
}

// waitIOEvent waits for the resync tick, a kick, or a new directory (a
// container's cgroup) in a watched pod cgroup. False when ctx ended.
func (pb pods) waitIOEvent(ctx context.Context, tick <-chan time.Time, events <-chan fsnotify.Event) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case <-pb.ioKick:
			return true
		case e, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if e.Has(fsnotify.Create) {
				return true
			}
		}
	}
}

// syncIOLimits sets the I/O limits of every publication of a limited volume,
// each under the volume's lock (an unpublished one never gets them back), and
// returns the pod cgroups to watch for new containers.
func (pb pods) syncIOLimits(ctx context.Context) map[string]bool {
	dirs := map[string]bool{}
	all, err := pb.vols.Publications("")
	if err != nil {
		klog.ErrorS(err, "Could not read the publications")
		return dirs
	}
	seen := map[string]bool{}
	for _, p := range all {
		if seen[p.VolumeID] {
			continue
		}
		seen[p.VolumeID] = true
		for _, uid := range pb.syncVolumeIO(ctx, p.VolumeID) {
			if d, err := pb.cg.WatchDir(uid); err == nil && d != "" {
				dirs[d] = true
			}
		}
	}
	return dirs
}

// syncVolumeIO sets volume id's I/O limits on its pods under the volume's
// lock and returns those pods (none without limits).
func (pb pods) syncVolumeIO(ctx context.Context, id string) []string {
	if v, err := pb.vols.Get(id); err != nil || contract.IOLimitsOf(v.MutableParameters) == (contract.IOLimits{}) {
		return nil // no lock taken for volumes without limits: most
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	unlock, err := pb.vols.LockWait(wctx, id)
	if err != nil {
		return nil // busy for long: the next resync
	}
	defer unlock()
	v, err := pb.vols.Get(id)
	if err != nil {
		return nil
	}
	l := contract.IOLimitsOf(v.MutableParameters)
	if l == (contract.IOLimits{}) {
		return nil
	}
	pubs, err := pb.vols.Publications(id)
	if err != nil {
		return nil
	}
	var uids []string
	for _, p := range pubs {
		if err := pb.setPodIO(v, p.PodUID, l); err != nil {
			klog.ErrorS(err, "Could not set I/O limits", "volumeID", v.ID, "podUID", p.PodUID)
		}
		uids = append(uids, p.PodUID)
	}
	return uids
}

// podWriters says which pods (UIDs) may write to volume v, or why a writer
// exists that freezing pods cannot stop. A staged image volume has none (its
// filesystem is frozen); a block volume's are its loop devices' mounts, a
// directory volume's its directory's besides a staging path: each a pod's.
func (pb pods) podWriters(v *contract.Volume) (uids []string, why string, err error) {
	if v.FsType != "" {
		return nil, "", nil
	}
	var points []string
	if v.AccessType == contract.AccessBlock {
		devs, err := loop.Devices(pb.vols.ImagePath(v.ID))
		if err != nil {
			return nil, "", err
		}
		for _, d := range devs {
			p, err := pb.mnt.MountPoints(d.Path)
			if err != nil {
				return nil, "", err
			}
			points = append(points, p...)
		}
	} else if points, err = dirMounts(v.ID); err != nil {
		return nil, "", err
	}
	if len(points) == 0 {
		return nil, "", nil
	}
	pubs, err := pb.vols.Publications(v.ID)
	if err != nil {
		return nil, "", err
	}
	pod, staging, known := map[string]string{}, map[string]bool{}, map[string]bool{}
	for _, p := range pubs {
		pod[mount.ResolveExisting(p.TargetPath)] = p.PodUID
		known[p.PodUID] = true
		if p.StagingPath != "" {
			staging[mount.ResolveExisting(p.StagingPath)] = true
		}
	}
	seen := map[string]bool{}
	for _, pt := range points {
		uid, ok := pod[pt]
		if !ok && v.AccessType == contract.AccessBlock && known[filepath.Base(pt)] {
			// The kubelet binds a raw block device once more per pod, at
			// .../volumeDevices/<volume>/dev/<pod UID>: that pod's.
			uid, ok = filepath.Base(pt), true
		}
		switch {
		case ok && !seen[uid]:
			seen[uid] = true
			uids = append(uids, uid)
		case ok, staging[pt]:
		default:
			return nil, "is mounted at " + pt + ", which is not a publication for a known pod (podInfoOnMount)", nil
		}
	}
	if pb.cg == nil && len(uids) > 0 {
		return nil, "is used by pods, and this node has no cgroup hierarchy to freeze them in (--cgroup-root)", nil
	}
	return uids, "", nil
}

// podFrozenPrefix names the freeze record of a pod in the frozen
// directory: pod-<uid>, holding the pod's freezer cgroup.
const podFrozenPrefix = "pod-"

// freezePod freezes pod uid's freezer cgroup, recorded durably first so a
// start after a crash thaws it, and returns the thaw (boundedThaw).
func (pb pods) freezePod(uid string) (func() error, error) {
	nop := func() error { return nil }
	dir, err := pb.cg.PodDir("freezer", uid)
	if err != nil {
		return nop, err
	}
	marker := filepath.Join(pb.root, frozenDir, podFrozenPrefix+uid)
	if err := writeDurably(marker, dir); err != nil {
		return nop, fmt.Errorf("record the freeze of pod %s: %w", uid, err)
	}
	thaw := func() error { return pb.thawPod(dir) }
	if _, err := pb.cg.Freeze(uid); err != nil {
		// Freeze thawed what it froze; the record goes only once the pod
		// is surely thawed (the next start thaws it otherwise).
		if terr := thaw(); terr == nil {
			_ = os.Remove(marker)
		} else {
			err = errors.Join(err, terr)
		}
		return nop, fmt.Errorf("freeze pod %s: %w", uid, err)
	}
	klog.V(2).InfoS("Pod frozen for a group snapshot", "podUID", uid, "cgroup", dir)
	return boundedThaw("pod "+uid, marker, thaw), nil
}

// thawPod thaws the pod cgroup dir, retrying for a second; its freeze record
// stays until it succeeds, for the next start.
func (pb pods) thawPod(dir string) error {
	var err error
	for try := 0; try < 20; try++ {
		if err = pb.cg.Thaw(dir); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	klog.ErrorS(err, "Could not thaw a pod frozen for a group snapshot; the node plugin's next start thaws it", "cgroup", dir)
	return err
}

// thawPodRecord thaws the pod cgroup a freeze record holds (a process
// killed while a pod was frozen).
func thawPodRecord(cg *cgroup.Hierarchy, marker string) error {
	b, err := os.ReadFile(marker)
	if err != nil {
		return err
	}
	dir := strings.TrimSpace(string(b))
	if cg == nil || !cg.IsPodDir(dir) {
		return fmt.Errorf("freeze record %s names %q, not a pod cgroup of this node's hierarchy", marker, dir)
	}
	if err := cg.Thaw(dir); err != nil {
		return err
	}
	klog.InfoS("Thawed a pod a killed driver left frozen", "cgroup", dir)
	return nil
}
