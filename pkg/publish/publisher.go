// Package publish is localdir's node side: the mounts NodeStageVolume,
// NodePublishVolume and their undoing make (through pkg/mount), the loop
// devices of image volumes (pkg/publish/loop), the pods that use volumes and
// their cgroups (I/O limits, freezes; pkg/publish/cgroup), and usage figures.
// It reaches the volumes only through Volumes (pkg/volume's Store).
package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/moby/sys/mountinfo"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish/cgroup"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// Volumes is what the node side needs of the volumes (pkg/volume's Store).
type Volumes interface {
	Get(id string) (*contract.Volume, error)
	Resolve(id string) (*contract.Volume, error)
	LookupByName(name string) (*contract.Volume, error)
	Create(spec contract.CreateSpec) (*contract.Volume, error)
	Delete(id string) error
	Lock(keys ...string) (func(), error)
	LockWait(ctx context.Context, id string) (func(), error)
	HoldRead(id, what string) (func(), error)
	EncryptedDirs() ([]*contract.Volume, error)
	EncryptedSnapshotDirs() ([]string, error)
	FillPending(v *contract.Volume, id fscrypt.Identifier) (*contract.Volume, error)
	Root() string
	DataPath(v *contract.Volume) string
	ImagePath(id string) string
	ImageDir() string
	ApplySize(v *contract.Volume) error
	Usage(v *contract.Volume) (used, inodes int64, err error)
	PutStage(id, stagingPath string) error
	DeleteStage(id, stagingPath string) error
	StagingPaths(id string) ([]string, error)
	PutPublication(p *state.Publication) error
	DeletePublication(id, targetPath string) error
	Publication(id, targetPath string) (*state.Publication, error)
	Publications(id string) ([]*state.Publication, error)
}

// Config configures a Publisher.
type Config struct {
	// Mounter does the node mounts and answers what is mounted where; nil
	// means mount.New(), the real one. Unit tests give a mount.Fake.
	Mounter mount.Interface
	// CgroupRoot is where the cgroup hierarchy is mounted; "": none, and then
	// pods cannot get I/O limits nor be frozen for a group snapshot.
	CgroupRoot string
}

// Publisher is the node side of one data root. Its methods are safe for
// concurrent use; each holds the volume's lock for the whole call.
type Publisher struct {
	vols   Volumes
	root   string            // the data root: freeze records in <root>/frozen
	mnt    mount.Interface   // node mounts and the mount table
	cg     *cgroup.Hierarchy // pod cgroups (nil: Config.CgroupRoot is "")
	ioKick chan struct{}     // wakes RunIOLimits
	pods   pods
	// keyMu serializes the stages and unstages of encrypted directory
	// volumes: their keys are shared on the data root's keyring, and an
	// unstage must not remove a key between another stage's adding it and
	// its mount (encrypt.go). It guards keyHolds and busyKeys.
	keyMu sync.Mutex
	// keyHolds counts the copies of encrypted directory volumes in
	// progress (HoldKey, and the fills of restores) by their key, which
	// they need while keyMu is released.
	keyHolds map[fscrypt.Identifier]int
	// busyKeys are keys removed while files encrypted with them were open
	// ("incompletely removed"), which retryRemovals removes again.
	busyKeys map[fscrypt.Identifier]bool
}

// New returns the node side of the volumes vols.
func New(vols Volumes, cfg Config) (*Publisher, error) {
	pb := &Publisher{vols: vols, root: vols.Root(), mnt: cfg.Mounter, ioKick: make(chan struct{}, 1),
		keyHolds: map[fscrypt.Identifier]int{}, busyKeys: map[fscrypt.Identifier]bool{}}
	pb.pods = pods{pb}
	if pb.mnt == nil {
		pb.mnt = mount.New()
	}
	if cfg.CgroupRoot != "" {
		var err error
		if pb.cg, err = cgroup.Open(cfg.CgroupRoot); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(filepath.Join(pb.root, frozenDir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create %s: %w", frozenDir, err)
	}
	return pb, nil
}

// AttachedLoopDevices counts the loop devices attached to this data root's
// image files.
func (pb *Publisher) AttachedLoopDevices() int { return loop.CountUnder(pb.vols.ImageDir()) }

// CheckUnused fails with contract.ErrPrecondition when v is mounted (a
// directory volume) or attached to a loop device (an image volume).
func (pb *Publisher) CheckUnused(v *contract.Volume) error {
	p := pb.vols.DataPath(v)
	if v.Image() {
		dev, err := loop.Find(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if dev != "" {
			return fmt.Errorf("%w: volume %s is still attached as %s (staged); unpublish and unstage it first", contract.ErrPrecondition, v.ID, dev)
		}
		return nil
	}
	busy, err := pb.mnt.InUse(p)
	if err != nil {
		return err
	}
	if busy {
		return fmt.Errorf("%w: volume %s is still mounted (staged or published); unpublish and unstage it first", contract.ErrPrecondition, v.ID)
	}
	return nil
}

// InUse reports whether path is mounted anywhere.
func (pb *Publisher) InUse(path string) (bool, error) { return pb.mnt.InUse(path) }

// Refresh makes the loop devices attached to image see its size.
func (pb *Publisher) Refresh(image string) error {
	_, err := loop.Refresh(image)
	return err
}

// Detach detaches every loop device attached to image.
func (pb *Publisher) Detach(image string) error { return loop.Detach(image) }

// ApplyMutable applies the node's part of a modify of v: dirMode to a staged
// image volume's filesystem root, the I/O limits to its pods' cgroups.
func (pb *Publisher) ApplyMutable(v *contract.Volume, mut contract.Mutable, merged map[string]string) error {
	if mut.DirMode != nil && v.FsType != "" {
		var mounts []string
		var err error
		if contract.Encrypted(v.Parameters) {
			// Its publications show the data directory, not the root:
			// chmod that through a stage.
			mounts, err = pb.vols.StagingPaths(v.ID)
			for i, sp := range mounts {
				mounts[i] = publishedRoot(v, sp)
			}
		} else {
			mounts, err = imageMounts(pb.vols.ImagePath(v.ID))
		}
		if err != nil {
			return err
		}
		if len(mounts) > 0 {
			if err := engine.ChmodRoot(mounts[0], *mut.DirMode); err != nil {
				return fmt.Errorf("volume %s: %w", v.ID, err)
			}
		}
	}
	if mut.IO != nil {
		return pb.pods.applyIOLimits(v, merged)
	}
	return nil
}

// NodeExpand makes the node side see volume id's recorded size (CSI
// NodeExpandVolume) and returns it: an image's loop device is refreshed and
// its filesystem at volumePath grown. A read hold keeps an expansion recorded
// meanwhile from being undone. Errors: contract.ErrNotFound, contract.ErrBusy.
func (pb *Publisher) NodeExpand(id, volumePath string) (int64, error) {
	unlock, err := pb.vols.Lock(id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	v, err := pb.vols.Resolve(id)
	if err != nil {
		return 0, err
	}
	release, err := pb.vols.HoldRead(v.ID, "a node expansion")
	if err != nil {
		return 0, err
	}
	defer release()
	if v, err = pb.vols.Get(v.ID); err != nil { // as of the hold
		return 0, err
	}
	if !filepath.IsAbs(volumePath) {
		return 0, fmt.Errorf("%w: volume_path %q is not an absolute path", contract.ErrNotFound, volumePath)
	}
	if _, err := os.Lstat(volumePath); err != nil {
		return 0, fmt.Errorf("%w: volume_path %q: %v", contract.ErrNotFound, volumePath, err)
	}
	if err := pb.vols.ApplySize(v); err != nil {
		return 0, err
	}
	if v.FsType != "" {
		// The device has its new size; the filesystem grows online where
		// it is mounted (volumePath: a publish or the staging path).
		dev, err := loop.FindMode(pb.vols.ImagePath(v.ID), false)
		if err != nil {
			return 0, err
		}
		if dev == "" {
			return 0, fmt.Errorf("%w: image volume %s is not staged on this node", contract.ErrPrecondition, v.ID)
		}
		if ok, err := pb.mnt.HoldsFS(volumePath, dev); err != nil || !ok {
			return 0, fmt.Errorf("%w: volume_path %q is not a mount of volume %s", contract.ErrNotFound, volumePath, v.ID)
		}
		if err := pb.mnt.ResizeFS(dev, volumePath); err != nil {
			return 0, err
		}
	}
	return v.CapacityBytes, nil
}

// FreezeGroup stops every write to vols at one point in time for a group
// snapshot: the pods that use them first (podWriters), then staged image
// volumes' filesystems (FIFREEZE); a frozen pod's writes to a raw block
// volume are flushed. The thaw undoes it in reverse order, once.
// contract.ErrPrecondition for a writer freezing pods cannot stop.
func (pb *Publisher) FreezeGroup(vols []*contract.Volume) (func() error, error) {
	var pods []string
	for _, v := range vols {
		uids, why, err := pb.pods.podWriters(v)
		if err != nil {
			return nil, err
		} else if why != "" {
			return nil, fmt.Errorf("%w: volume %s %s: localdir cannot stop its writes for a consistent group snapshot; take it out of the group or stop what uses it", contract.ErrPrecondition, v.ID, why)
		}
		for _, u := range uids {
			if !slices.Contains(pods, u) {
				pods = append(pods, u)
			}
		}
	}
	var thaws []func() error
	thawAll := func() error {
		var errs []error
		for i := len(thaws) - 1; i >= 0; i-- {
			errs = append(errs, thaws[i]())
		}
		thaws = nil
		return errors.Join(errs...)
	}
	fail := func(err error) (func() error, error) {
		_ = thawAll()
		return nil, err
	}
	for _, uid := range pods {
		thaw, err := pb.pods.freezePod(uid)
		if errors.Is(err, cgroup.ErrNoPod) {
			return fail(fmt.Errorf("%w: %v (is --cgroup-root the host's cgroup hierarchy?)", contract.ErrPrecondition, err))
		}
		if err != nil {
			return fail(fmt.Errorf("%w: %v", contract.ErrBusy, err))
		}
		thaws = append(thaws, thaw)
	}
	for _, v := range vols {
		switch {
		case v.FsType != "":
			thaw, err := pb.Freeze(v)
			if err != nil {
				return fail(err)
			}
			thaws = append(thaws, thaw)
		case v.AccessType == contract.AccessBlock && len(pods) > 0:
			if err := flushDevice(pb.vols.ImagePath(v.ID)); err != nil {
				return fail(err)
			}
		}
	}
	return thawAll, nil
}

// dirMounts are the mount points of directory volume id's directory.
func dirMounts(id string) ([]string, error) {
	suffix := "/volumes/" + id
	mounts, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return !strings.HasSuffix(i.Root, suffix), false
	})
	var points []string
	for _, i := range mounts {
		points = append(points, i.Mountpoint)
	}
	return points, err
}

// flushDevice fsyncs image's read-write loop device, so a copy of the image
// holds every write made to the device.
func flushDevice(image string) error {
	dev, err := loop.FindMode(image, false)
	if err != nil || dev == "" {
		return err
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", dev, err)
	}
	return nil
}

// imageDirMode is the root permission an image volume's filesystem gets at
// stage: mutable dirMode, else the StorageClass's; ok false for neither.
func imageDirMode(v *contract.Volume) (mode uint32, ok bool) {
	for _, p := range []map[string]string{v.MutableParameters, v.Parameters} {
		if s, set := p[contract.ParamDirMode]; set {
			if mode, err := contract.ParseDirMode(contract.ParamDirMode, s); err == nil {
				return mode, true
			}
		}
	}
	return 0, false
}
