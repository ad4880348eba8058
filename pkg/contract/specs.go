package contract

// The requests the CSI services hand to a backend and its other answers,
// shared so that pkg/cluster uses them without importing the data plane.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
)

// CreateSpec describes a new volume.
type CreateSpec struct {
	// ID is the volume_id to use; "": a fresh one. A node creating an id it
	// already holds returns the existing volume (reconciler idempotency).
	ID string
	// Name is the CSI name (stored, never used in a path).
	Name string
	// SizeBytes is the capacity to reserve, in bytes (> 0).
	SizeBytes int64
	// AccessType is AccessMount or AccessBlock.
	AccessType AccessType
	// FsType makes a mount volume an image volume: an image file the node
	// formats with this filesystem at its first stage. "": a directory.
	FsType string
	// Parameters are stored with the record.
	Parameters map[string]string
	// MutableParameters (ParseMutable) are applied to the new
	// volume's data before its record is committed, and stored with it.
	MutableParameters map[string]string
	// DirMode is the chmod(2) bits of a mount volume's root, e.g. 0o2770.
	DirMode uint32
	// SourceSnapshotID / SourceVolumeID fill the new volume with a copy of
	// a snapshot or another volume (at most one is set).
	SourceSnapshotID, SourceVolumeID string
	// BaseSnapshotID, for a Send of snapshot SourceSnapshotID to another
	// node: a snapshot of the same volume that node holds too; an image
	// is then sent as its difference from it (engine.SendFileDelta).
	BaseSnapshotID string
	// Ephemeral marks a CSI ephemeral inline volume created for the
	// CO-chosen EphemeralID; Name must be EphemeralName(EphemeralID).
	Ephemeral   bool
	EphemeralID string
	// PVCNamespace / PVCName name the claim the volume is made for, when
	// the CO says (external-provisioner --extra-create-metadata): cluster
	// mode reports a transfer's progress to it as Events.
	PVCNamespace, PVCName string
}

// Parameters the external-provisioner adds with --extra-create-metadata.
const (
	ParamPVCName      = ReservedPrefix + "pvc/name"
	ParamPVCNamespace = ReservedPrefix + "pvc/namespace"
)

// EphemeralName is the name the ephemeral volume of a CO-chosen id is recorded
// under; its leading NUL byte, banned in CSI names, keeps it apart from them.
func EphemeralName(coID string) string { return "\x00ephemeral/" + coID }

// SnapshotSpec describes a new snapshot.
type SnapshotSpec struct {
	// ID is the snapshot_id to use; empty means a fresh random one. An id
	// the node already holds returns the existing snapshot.
	ID string
	// Name is the CSI name; SourceVolumeID the volume to snapshot.
	Name, SourceVolumeID string
}

// GroupSnapshot is a volume group snapshot: its id, its member snapshots
// (by source volume id order) and when they were cut.
type GroupSnapshot struct {
	ID        string
	Snapshots []*Snapshot
	CreatedAt time.Time
}

// CheckGroupMembers checks the snapshot_ids a CO gave for group gid (none: no
// check): every existing member is named, and every named id is a member or
// gone (a cut-short delete). Errors: ErrInvalid naming the snapshot.
func CheckGroupMembers(gid string, members, given []string, exists func(id string) bool) error {
	if len(given) == 0 {
		return nil
	}
	for _, id := range members {
		if !slices.Contains(given, id) && exists(id) {
			return fmt.Errorf("%w: snapshot_ids lack %s, a snapshot of group %s", ErrInvalid, id, gid)
		}
	}
	for _, id := range given {
		if !slices.Contains(members, id) && exists(id) {
			return fmt.Errorf("%w: snapshot %s is not part of group %s", ErrInvalid, id, gid)
		}
	}
	return nil
}

// Health is a volume's condition (CSI VolumeHealth).
type Health struct {
	// Problems is empty for a healthy volume.
	Problems []Problem
}

// Problem is one abnormal condition.
type Problem struct {
	// Kind is "Inaccessible", "Degraded" or "DataLoss".
	Kind    string
	Reason  string // CamelCase
	Message string
}

// CheckMutableKind is CheckMutable for a volume of accessType and fsType (id
// "": not created yet); compression's need of btrfs is checked on the node.
func CheckMutableKind(id string, accessType AccessType, fsType string, params map[string]string) error {
	mut, err := MutableOf(params)
	if err != nil {
		return err
	}
	if id == "" {
		id = "(new)"
	}
	return CheckMutable(&Volume{ID: id, AccessType: accessType, FsType: fsType}, true, mut)
}

// CheckMutable refuses (ErrInvalid) a mutable parameter the kind
// of volume v cannot take; onBtrfs: its data is on btrfs.
func CheckMutable(v *Volume, onBtrfs bool, mut Mutable) error {
	kind := "a directory volume"
	switch {
	case v.AccessType == AccessBlock:
		kind = "a raw block volume"
	case v.FsType != "":
		kind = "an image volume (" + v.FsType + ")"
	}
	if mut.DirMode != nil && v.AccessType == AccessBlock {
		return fmt.Errorf("%w: mutable parameter %s applies to filesystem volumes; volume %s is %s", ErrInvalid, ParamDirMode, v.ID, kind)
	}
	if mut.IO != nil && !v.Image() {
		return fmt.Errorf("%w: mutable parameters %s apply to image volumes (raw block, or csi.storage.k8s.io/fstype ext4 or xfs), whose loop device they limit; volume %s is %s", ErrInvalid, strings.Join(IOLimitParameters, ", "), v.ID, kind)
	}
	if mut.Compression != nil && (v.Image() || !onBtrfs) {
		where := ""
		if !v.Image() {
			where = " on a data root that is not btrfs (engine " + string(v.Engine) + ")"
		}
		return fmt.Errorf("%w: mutable parameter %s applies to directory volumes on btrfs; volume %s is %s%s", ErrInvalid, ParamCompression, v.ID, kind, where)
	}
	return nil
}

// MutableOf is ParseMutable with its INVALID_ARGUMENT status turned into
// ErrInvalid (the message kept), as the backends' errors are.
func MutableOf(params map[string]string) (Mutable, error) {
	mut, err := ParseMutable(params)
	if err != nil {
		return mut, fmt.Errorf("%w: %s", ErrInvalid, status.Convert(err).Message())
	}
	return mut, nil
}

// PublishOptions are the arguments of a publish (CSI NodePublishVolume).
type PublishOptions struct {
	// StagingPath is where the volume is staged (not for an ephemeral
	// volume); TargetPath where it is to be published.
	StagingPath, TargetPath string
	// AccessType is what the request's capability asks for
	// (AccessMount or AccessBlock).
	AccessType AccessType
	// ReadOnly publishes read-only.
	ReadOnly bool
	// SingleWriter (SINGLE_NODE_SINGLE_WRITER): the volume may be published
	// at one target path only.
	SingleWriter bool
	// MountFlags are the capability's mount flags (mount.ParseFlags).
	MountFlags []string
	// PodUID is the pod the volume is published for (volume_context
	// csi.storage.k8s.io/pod.uid), "" when the CO did not say.
	PodUID string
}

// Usage is what a volume holds, for CSI NodeGetVolumeStats.
type Usage struct {
	// TotalBytes is the capacity; UsedBytes the space its files occupy
	// (the engine's figure; for block volumes the bytes written to the
	// image); AvailableBytes the rest, never negative.
	TotalBytes, UsedBytes, AvailableBytes int64
	// HasInodes says whether the inode figures are known (not for block
	// volumes, nor on btrfs, which has no inode limit).
	HasInodes bool
	// UsedInodes counts the volume's files and directories, FreeInodes what
	// its filesystem has left; TotalInodes is their sum.
	TotalInodes, UsedInodes, FreeInodes int64
}

// CapacityInfo is the capacity of the data root, in bytes.
type CapacityInfo struct {
	// Total is the configured capacity, or the filesystem's size.
	Total int64
	// Allocated is the sum of the volumes' sizes, creates and growths included.
	Allocated int64
	// Free is the free space of the filesystem (statfs f_bavail).
	Free int64
	// Headroom is what existing volumes may still write: the sum of their
	// size minus their last measured use (at least 0 each).
	Headroom int64
	// Available is what a new volume can still be guaranteed:
	// min(Total - Allocated, Free - Headroom), never negative.
	Available int64
}

// Leftover is data that start-up recovery found and could not put in
// order. It is kept where it is; the driver serves everything else.
type Leftover struct {
	// Path is the data's path on the node.
	Path string
	// Problem says what recovery tried and why it failed.
	Problem string
}
