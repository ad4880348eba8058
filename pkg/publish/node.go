package publish

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// Staged and published state is read from the mount table (Config.Mounter),
// never from records.

// Stage prepares volume id on this node (CSI NodeStageVolume) at stagingPath,
// an existing directory, not a symlink: a directory volume is bind-mounted
// there (image and block volumes: stageImage, stageBlock). The same stage
// again succeeds; another volume, other flags or a foreign mount there is
// contract.ErrExists. Errors also: contract.ErrNotFound, contract.ErrInvalid,
// contract.ErrPrecondition (the other access type), contract.ErrBusy.
// secrets are the node-stage Secret's, which an encrypted volume's key
// comes from (unlockImage); they are never logged or stored.
func (pb *Publisher) Stage(id, stagingPath string, accessType contract.AccessType, flags []string, secrets map[string]string) error {
	unlock, err := pb.vols.Lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	// Held while it mounts: a delete that checked the volume unused must
	// not remove its data under a mount made just after.
	release, err := pb.vols.HoldRead(id, "a stage")
	if err != nil {
		return err
	}
	defer release()
	v, err := pb.vols.Get(id)
	if err != nil {
		return err
	}
	if err := matchAccess(v, accessType); err != nil {
		return err
	}
	if contract.Encrypted(v.Parameters) {
		if err := fscrypt.CheckSecret(secrets); err != nil {
			return fmt.Errorf("volume %s: %w", v.ID, err)
		}
	}
	mf, err := mount.ParseFlags(flags)
	if err != nil {
		return err
	}
	if err := pb.mnt.PrepareDir(stagingPath, "staging_target_path", false); err != nil {
		return err
	}
	switch {
	case v.AccessType == contract.AccessBlock:
		return pb.stageBlock(id, stagingPath)
	case v.FsType != "":
		return pb.stageImage(v, stagingPath, flags, secrets)
	case v.EncryptedDir():
		return pb.stageEncryptedDir(v, stagingPath, mf, secrets)
	}
	return pb.mnt.Bind(mount.Bind{Source: pb.vols.DataPath(v), Target: stagingPath, Flags: mf})
}

// stageImage attaches image volume v's read-write loop device and mounts its
// filesystem at stagingPath (formatted at its first stage, grown when smaller
// than its device) and unlocks an encrypted one; a mount or device this call
// made is undone if that fails.
func (pb *Publisher) stageImage(v *contract.Volume, stagingPath string, flags []string, secrets map[string]string) error {
	img := pb.vols.ImagePath(v.ID)
	had, err := loop.FindMode(img, false)
	if err != nil {
		return err
	}
	wasStaged := false
	if had != "" {
		if wasStaged, err = pb.mnt.HoldsFS(stagingPath, had); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	dev, err := loop.Attach(img)
	if err != nil {
		return err
	}
	// Recorded before the mount: another stage of the volume (two PVs of
	// one volume on this node) is then never taken for a publication that
	// blocks unstaging (unpublishedFirst).
	if err := pb.vols.PutStage(v.ID, stagingPath); err != nil {
		return err
	}
	opts := flags
	if v.FsType == "xfs" {
		// A restore or clone carries its source's filesystem UUID, and XFS
		// refuses to mount a second filesystem with a UUID already mounted.
		opts = append(slices.Clone(flags), "nouuid")
	}
	var formatOpts []string
	encrypted := contract.Encrypted(v.Parameters)
	if encrypted {
		formatOpts = encryptFormatOptions
	}
	if err := pb.mnt.FormatAndMount(dev, stagingPath, v.FsType, opts, formatOpts); err != nil {
		if had == "" {
			if derr := loop.Detach(img); derr != nil {
				klog.ErrorS(derr, "Could not detach the loop device of a failed stage", "image", img)
			}
		}
		return err
	}
	if err := pb.mnt.ResizeFS(dev, stagingPath); err != nil {
		return err
	}
	if encrypted {
		err = pb.unlockImage(v, stagingPath, secrets)
	} else if v.FsType == "ext4" {
		err = refuseEncrypted(v, stagingPath)
	}
	if err != nil {
		if !wasStaged {
			pb.undoStage(v, stagingPath, had == "")
		}
		return err
	}
	if mode, ok := imageDirMode(v); ok && !slices.Contains(flags, "ro") {
		if err := engine.ChmodRoot(publishedRoot(v, stagingPath), mode); err != nil {
			return err
		}
	}
	klog.V(2).InfoS("Image volume staged", "volumeID", v.ID, "device", dev, "fsType", v.FsType, "stagingPath", stagingPath)
	return nil
}

// undoStage unmounts what a failed stage of image volume v mounted at
// stagingPath, forgets that stage and, with detach, detaches the loop device
// the stage attached; failures are logged (the stage's error is returned).
func (pb *Publisher) undoStage(v *contract.Volume, stagingPath string, detach bool) {
	if err := pb.mnt.Unmount(stagingPath); err != nil {
		klog.ErrorS(err, "Could not unmount a failed stage", "volumeID", v.ID, "stagingPath", stagingPath)
		return
	}
	if err := pb.vols.DeleteStage(v.ID, stagingPath); err != nil {
		klog.ErrorS(err, "Could not forget a failed stage", "volumeID", v.ID, "stagingPath", stagingPath)
	}
	if detach {
		if err := loop.Detach(pb.vols.ImagePath(v.ID)); err != nil {
			klog.ErrorS(err, "Could not detach the loop device of a failed stage", "volumeID", v.ID)
		}
	}
}

// stagedImage reports whether image volume v is staged at stagingPath:
// its read-write loop device is attached and its filesystem mounted there.
func (pb *Publisher) stagedImage(v *contract.Volume, stagingPath string) (bool, error) {
	dev, err := loop.FindMode(pb.vols.ImagePath(v.ID), false)
	if err != nil || dev == "" {
		return false, err
	}
	return pb.mnt.HoldsFS(stagingPath, dev)
}

// stageBlock attaches block volume id's read-write loop device and makes
// <stagingPath>/<id> a device node of it (which Stats looks for); a device
// this call attached is detached if that fails.
func (pb *Publisher) stageBlock(id, stagingPath string) error {
	img := pb.vols.ImagePath(id)
	had, err := loop.FindMode(img, false)
	if err != nil {
		return err
	}
	dev, err := loop.Attach(img)
	if err != nil {
		return err
	}
	p := stagedDevicePath(stagingPath, id)
	if err := pb.mnt.PlaceDevice(p, dev); err != nil {
		if had == "" {
			if derr := loop.Detach(img); derr != nil {
				klog.ErrorS(derr, "Could not detach the loop device of a failed stage", "image", img)
			}
		}
		return err
	}
	klog.V(2).InfoS("Block volume staged", "volumeID", id, "device", dev, "node", p)
	return nil
}

// stagedDevicePath is <stagingPath>/<id>; it panics on an id that is not a
// volume_id, so a path is never built from anything else.
func stagedDevicePath(stagingPath, id string) string {
	if !contract.ValidVolumeID(id) {
		panic(fmt.Sprintf("publish: device path requested for invalid volume id %q", id))
	}
	return filepath.Join(stagingPath, id)
}

func matchAccess(v *contract.Volume, accessType contract.AccessType) error {
	if v.AccessType != accessType {
		return fmt.Errorf("%w: volume %s is a %s volume; the capability asks for %s", contract.ErrPrecondition, v.ID, v.AccessType, accessType)
	}
	return nil
}

// Unstage undoes Stage (CSI NodeUnstageVolume) at stagingPath, which stays.
// A volume not staged there, or unknown, is success and nothing changes: a
// wrong path never detaches a loop device used elsewhere.
// contract.ErrPrecondition while an image or block volume staged there is
// still published. Like Unpublish it waits (bounded by ctx) for another call
// on the volume before contract.ErrBusy: the CO must be able to finish.
func (pb *Publisher) Unstage(ctx context.Context, id, stagingPath string) error {
	unlock, err := pb.vols.LockWait(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	v, err := pb.vols.Resolve(id)
	switch {
	case errors.Is(err, contract.ErrNotFound):
		if err := pb.mnt.Unmount(stagingPath); err != nil {
			return err
		}
		if contract.ValidVolumeID(id) {
			return pb.mnt.RemoveDevice(stagedDevicePath(stagingPath, id))
		}
		return nil
	case err != nil:
		return err
	case v.AccessType == contract.AccessBlock:
		return pb.unstageBlock(v, stagingPath)
	case v.FsType != "":
		return pb.unstageImage(v, stagingPath)
	case v.EncryptedDir():
		return pb.unstageEncryptedDir(v, stagingPath)
	}
	return pb.mnt.Unmount(stagingPath)
}

// unstageBlock is Unstage of block volume v: staged at stagingPath when the
// node there is its read-write device; with none attached (a retry) only a
// leftover node is removed.
func (pb *Publisher) unstageBlock(v *contract.Volume, stagingPath string) error {
	img, node := pb.vols.ImagePath(v.ID), stagedDevicePath(stagingPath, v.ID)
	devs, err := loop.Devices(img)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	rw := ""
	for _, d := range devs {
		if !d.ReadOnly {
			rw = d.Path
		}
	}
	if rw == "" {
		return pb.mnt.RemoveDevice(node)
	}
	if here, err := pb.mnt.HasDevice(node, rw); err != nil || !here {
		if err == nil {
			klog.V(2).InfoS("Block volume not staged at this path; nothing to unstage", "volumeID", v.ID, "stagingPath", stagingPath, "device", rw)
		}
		return err
	}
	for _, d := range devs {
		if err := pb.unpublishedFirst(v.ID, d.Path); err != nil {
			return err
		}
	}
	if err := loop.Detach(img); err != nil {
		return err
	}
	return pb.mnt.RemoveDevice(node)
}

// unstageImage is Unstage of image volume v. Its loop device is detached only
// once no mount shows the filesystem: a stage elsewhere keeps it, one whose
// mount failed or a retry after the unmount does not.
func (pb *Publisher) unstageImage(v *contract.Volume, stagingPath string) error {
	img := pb.vols.ImagePath(v.ID)
	rw, err := loop.FindMode(img, false)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if rw == "" {
		return pb.vols.DeleteStage(v.ID, stagingPath)
	}
	staged, err := pb.mnt.HoldsFS(stagingPath, rw)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if staged {
		if err := pb.unpublishedFirst(v.ID, stagingPath); err != nil {
			return err
		}
		if contract.Encrypted(v.Parameters) {
			// The key goes with the filesystem's last mount: another stage
			// of the volume (two PVs of it) still uses it.
			points, err := pb.mnt.FSMountPoints(rw)
			if err != nil {
				return err
			}
			if len(points) <= 1 {
				if err := lockImage(v, stagingPath); err != nil {
					return err
				}
			}
		}
		if err := pb.mnt.Unmount(stagingPath); err != nil {
			return err
		}
	}
	if err := pb.vols.DeleteStage(v.ID, stagingPath); err != nil {
		return err
	}
	if points, err := pb.mnt.FSMountPoints(rw); err != nil || len(points) > 0 {
		if err == nil {
			klog.V(2).InfoS("Image volume's filesystem still mounted elsewhere; its loop device stays", "volumeID", v.ID, "stagingPath", stagingPath, "mountedAt", points[0])
		}
		return err
	}
	return loop.Detach(img)
}

// unpublishedFirst refuses (contract.ErrPrecondition) to unstage volume id
// while another mount still shows src, a publication the CO did not unpublish
// that unstaging would leave on a device nobody can find again.
// The volume's other recorded stages (an image volume staged at two paths:
// two PVs of it) show src too but are not publications, and neither are the
// publications recorded as made from those other stages: they stay on the
// filesystem those stages keep mounted.
func (pb *Publisher) unpublishedFirst(id, src string) error {
	points, err := pb.mnt.MountPoints(src)
	if err != nil {
		return err
	}
	stages, err := pb.vols.StagingPaths(id)
	if err != nil {
		return err
	}
	pubs, err := pb.vols.Publications(id)
	if err != nil {
		return err
	}
	self := mount.ResolveExisting(src)
	elsewhere := map[string]bool{}
	for _, s := range stages {
		if r := mount.ResolveExisting(s); r != self {
			elsewhere[r] = true
		}
	}
	for _, p := range pubs {
		if p.StagingPath != "" && elsewhere[mount.ResolveExisting(p.StagingPath)] {
			elsewhere[mount.ResolveExisting(p.TargetPath)] = true
		}
	}
	for _, p := range points {
		if r := mount.ResolveExisting(p); r != self && !elsewhere[r] {
			return fmt.Errorf("%w: volume %s is still published at %q; unpublish it first", contract.ErrPrecondition, id, p)
		}
	}
	return nil
}

// Publish makes the staged volume id visible at o.TargetPath (CSI
// NodePublishVolume), made one level deep unless it exists: a bind mount from
// o.StagingPath, or of a block volume's device node (publishBlock). Errors:
// contract.ErrInvalid (a symlink at the target), contract.ErrPrecondition (not
// staged; with o.SingleWriter, published elsewhere), contract.ErrExists (any
// other mount there than the same publish), contract.ErrBusy.
func (pb *Publisher) Publish(id string, o contract.PublishOptions) error {
	unlock, err := pb.vols.Lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	v, err := pb.vols.Get(id)
	if err != nil {
		return err
	}
	if err := pb.publish(v, o); err != nil {
		return err
	}
	return pb.pods.recordPublication(v, o)
}

func (pb *Publisher) publish(v *contract.Volume, o contract.PublishOptions) error {
	id := v.ID
	if err := matchAccess(v, o.AccessType); err != nil {
		return err
	}
	mf, err := mount.ParseFlags(o.MountFlags)
	if err != nil {
		return err
	}
	if v.AccessType == contract.AccessBlock {
		return pb.publishBlock(id, o)
	}
	src, from := pb.vols.DataPath(v), o.StagingPath
	staged, err := pb.mnt.Shows(o.StagingPath, src)
	if v.FsType != "" {
		// The root of its filesystem (an encrypted one's data directory),
		// as mounted at the staging path, is bound itself.
		src = publishedRoot(v, o.StagingPath)
		from = src
		staged, err = pb.stagedImage(v, o.StagingPath)
	}
	if err != nil || !staged {
		return fmt.Errorf("%w: volume %s is not staged at %q (call NodeStageVolume first)", contract.ErrPrecondition, id, o.StagingPath)
	}
	if o.SingleWriter {
		if err := pb.onlyAt(id, []string{src}, o.StagingPath, o.TargetPath); err != nil {
			return err
		}
	}
	if err := pb.mnt.PrepareDir(o.TargetPath, "target_path", true); err != nil {
		return err
	}
	return pb.mnt.Bind(mount.Bind{Source: src, From: from, Target: o.TargetPath, Flags: mf, ReadOnly: o.ReadOnly})
}

// onlyAt enforces SINGLE_NODE_SINGLE_WRITER: srcs (the volume's directory or
// loop device nodes) may be mounted only at paths.
func (pb *Publisher) onlyAt(id string, srcs []string, paths ...string) error {
	allowed := map[string]bool{}
	for _, p := range paths {
		allowed[mount.ResolveExisting(p)] = true
	}
	for _, src := range srcs {
		points, err := pb.mnt.MountPoints(src)
		if err != nil {
			return err
		}
		for _, p := range points {
			if !allowed[p] {
				return fmt.Errorf("%w: volume %s has access mode SINGLE_NODE_SINGLE_WRITER and is already published at %q", contract.ErrPrecondition, id, p)
			}
		}
	}
	return nil
}

// publishBlock binds block volume id's read-write loop device, or for
// o.ReadOnly a read-only one on the same image (attached when missing), onto
// the file o.TargetPath. The read-only device makes writes fail (EPERM), which
// a mount flag on a device node would not; a failed publish detaches it.
func (pb *Publisher) publishBlock(id string, o contract.PublishOptions) error {
	img := pb.vols.ImagePath(id)
	rw, err := loop.FindMode(img, false)
	if err != nil || rw == "" {
		return fmt.Errorf("%w: block volume %s is not staged (no loop device attached; call NodeStageVolume first)", contract.ErrPrecondition, id)
	}
	if o.SingleWriter {
		devs, err := loop.Devices(img)
		if err != nil {
			return err
		}
		var srcs []string
		for _, d := range devs {
			srcs = append(srcs, d.Path)
		}
		if err := pb.onlyAt(id, srcs, o.TargetPath); err != nil {
			return err
		}
	}
	if err := pb.mnt.PrepareFile(o.TargetPath); err != nil {
		return err
	}
	if !o.ReadOnly {
		return pb.mnt.Bind(mount.Bind{Source: rw, Target: o.TargetPath})
	}
	ro, err := loop.AttachReadOnly(img)
	if err != nil {
		return err
	}
	if err := pb.mnt.Bind(mount.Bind{Source: ro, Target: o.TargetPath, ReadOnly: true}); err != nil {
		if rerr := pb.releaseReadOnly(img); rerr != nil {
			klog.ErrorS(rerr, "Could not detach an unused read-only loop device", "image", img)
		}
		return err
	}
	return nil
}

// releaseReadOnly detaches the read-only loop device of the image img when
// no mount shows it any more (its last read-only publication is gone).
func (pb *Publisher) releaseReadOnly(img string) error {
	dev, err := loop.FindMode(img, true)
	if errors.Is(err, os.ErrNotExist) || (err == nil && dev == "") {
		return nil
	}
	if err != nil {
		return err
	}
	points, err := pb.mnt.MountPoints(dev)
	if err != nil || len(points) > 0 {
		return err
	}
	if err := loop.DetachReadOnly(img); err != nil {
		return err
	}
	klog.V(2).InfoS("Read-only loop device detached: no read-only publication left", "image", img, "device", dev)
	return nil
}

// PublishEphemeral creates (once) the CSI ephemeral inline volume spec
// describes and bind-mounts it, unstaged, onto o.TargetPath; a volume it
// created is deleted if the mount fails. It locks the CO id spec.EphemeralID.
func (pb *Publisher) PublishEphemeral(spec contract.CreateSpec, o contract.PublishOptions) error {
	unlock, err := pb.vols.Lock(spec.EphemeralID)
	if err != nil {
		return err
	}
	defer unlock()
	v, err := pb.vols.LookupByName(spec.Name)
	if err != nil {
		return err
	}
	created := false
	if v == nil {
		if v, err = pb.vols.Create(spec); err != nil {
			return err
		}
		created = true
	}
	if err := pb.publishEphemeral(v, o); err != nil {
		if created {
			if derr := pb.vols.Delete(v.ID); derr != nil {
				klog.ErrorS(derr, "Could not delete an ephemeral volume whose publish failed", "volumeID", v.ID)
			}
		}
		return err
	}
	return nil
}

func (pb *Publisher) publishEphemeral(v *contract.Volume, o contract.PublishOptions) error {
	mf, err := mount.ParseFlags(o.MountFlags)
	if err != nil {
		return err
	}
	if err := pb.mnt.PrepareDir(o.TargetPath, "target_path", true); err != nil {
		return err
	}
	return pb.mnt.Bind(mount.Bind{Source: pb.vols.DataPath(v), Target: o.TargetPath, Flags: mf, ReadOnly: o.ReadOnly})
}

// Unpublish undoes Publish (CSI NodeUnpublishVolume): it unmounts and removes
// targetPath (missing: success; a symlink is removed, not followed), detaches
// a block volume's unused read-only loop device and deletes an ephemeral
// volume. It waits (bounded by ctx, then contract.ErrBusy) for another call on
// the volume: kubelet must be able to finish (a pod stays Terminating until
// then). contract.ErrPrecondition for a non-empty directory that is no mount.
func (pb *Publisher) Unpublish(ctx context.Context, id, targetPath string) error {
	unlock, err := pb.vols.LockWait(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := pb.mnt.Remove(targetPath); err != nil {
		return err
	}
	v, err := pb.vols.Resolve(id)
	if errors.Is(err, contract.ErrNotFound) {
		return pb.vols.DeletePublication(id, targetPath)
	}
	if err != nil {
		return err
	}
	if err := pb.pods.forgetPublication(v, targetPath); err != nil {
		return err
	}
	if v.Ephemeral && !contract.ValidVolumeID(id) {
		return pb.vols.Delete(v.ID)
	}
	if v.EncryptedDir() {
		return pb.lockDirAfter(v)
	}
	if v.AccessType != contract.AccessBlock {
		return nil
	}
	return pb.releaseReadOnly(pb.vols.ImagePath(v.ID))
}
