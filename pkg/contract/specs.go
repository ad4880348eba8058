package contract

// The requests the CSI services hand to a backend, and what a backend
// answers besides Volume and Snapshot: shared here so that the controller
// side (pkg/cluster) uses them without importing the data plane.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
)

// CreateSpec describes a new volume.
type CreateSpec struct {
	// ID is the volume_id to use; empty means a fresh random one. The
	// cluster controller chooses ids, and a node creating an id it already
	// holds gets the existing volume back (the reconciler's idempotency).
	ID string
	// Name is the CSI name (stored, never used in a path).
	Name string
	// SizeBytes is the capacity to reserve, in bytes (> 0).
	SizeBytes int64
	// AccessType is AccessMount or AccessBlock.
	AccessType AccessType
	// FsType makes a mount volume an image volume: an image file of
	// SizeBytes (at least FsTypes[FsType]) that the node formats
	// with this filesystem when it is first staged. "" for a directory.
	FsType string
	// Parameters are stored with the record.
	Parameters map[string]string
	// MutableParameters (ParseMutable) are applied to the new
	// volume's data before its record is committed, and stored with it.
	MutableParameters map[string]string
	// DirMode is the permission of a mount volume's root directory (chmod(2)
	// bits, e.g. 0o2770).
	DirMode uint32
	// SourceSnapshotID / SourceVolumeID fill the new volume with a copy of
	// a snapshot or another volume (at most one is set).
	SourceSnapshotID, SourceVolumeID string
	// Ephemeral marks a CSI ephemeral inline volume created for the
	// CO-chosen EphemeralID; Name must be EphemeralName(EphemeralID).
	Ephemeral   bool
	EphemeralID string
}

// EphemeralName is the name key under which the ephemeral volume for a
// CO-chosen volume_id is recorded. It starts with a NUL byte, which no CSI
// name may contain, so it never collides with a CreateVolume name.
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

// CheckGroupMembers checks the snapshot_ids a CO gave for group gid
// (none: no check) against members, the group's snapshot ids: every
// member that still exists is named, and every id named is a member or a
// snapshot that no longer exists (one a delete cut short removed already).
// exists tells whether a snapshot id exists. Errors: ErrInvalid
// naming the snapshot.
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

// CheckMutableKind tells whether volume id ("" for a volume not created
// yet: CreateVolume's mutable_parameters, before it is placed), of
// accessType and fsType, can take the mutable parameters params:
// ErrInvalid naming the one it cannot take. That compression
// needs a data root on btrfs is only known on the node.
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
	// csi.storage.k8s.io/pod.uid), "" when the CO did not say: recorded
	// for the volume's I/O limits and group snapshot freezes (pods.go).
	PodUID string
}

// Usage is what a volume holds, for CSI NodeGetVolumeStats.
type Usage struct {
	// TotalBytes is the volume's capacity in bytes; UsedBytes the space its
	// files occupy (qgroup referenced bytes on btrfs; allocated blocks with
	// hard links counted once on dir; for block volumes the bytes written
	// to the image, its data segments); AvailableBytes = TotalBytes -
	// UsedBytes, never negative.
	TotalBytes, UsedBytes, AvailableBytes int64
	// HasInodes says whether the inode figures are known (not for block
	// volumes, nor on btrfs, which has no inode limit).
	HasInodes bool
	// UsedInodes counts the volume's files and directories (hard links
	// once); FreeInodes is what its filesystem has left; TotalInodes is
	// their sum.
	TotalInodes, UsedInodes, FreeInodes int64
}

// CapacityInfo is the capacity of the data root, in bytes.
type CapacityInfo struct {
	// Total is the configured capacity, or the filesystem's size.
	Total int64
	// Allocated is the sum of the sizes of existing volumes (and of the
	// creates and expansions in progress).
	Allocated int64
	// Free is the free space of the filesystem (statfs f_bavail).
	Free int64
	// Headroom is what existing volumes may still write: the sum over them
	// of their size minus the bytes they use (never below 0 per volume), as
	// last measured.
	Headroom int64
	// Available is what a new volume can still be guaranteed:
	// min(Total - Allocated, Free - Headroom), never negative. Creating a
	// volume of S bytes lowers it by S; deleting it gives S back.
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
