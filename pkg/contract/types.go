package contract

import "time"

// AccessType is how a volume is used, after the access_type oneof of CSI
// VolumeCapability: AccessMount or AccessBlock.
type AccessType string

// The access types.
const (
	AccessMount AccessType = "mount"
	AccessBlock AccessType = "block"
)

// Engine is the storage engine that lays out a volume's data on its node
// (recorded with each volume, chosen with --engine).
type Engine string

// The engines; EngineAuto is only a choice (btrfs where the data root is on
// btrfs, else dir), never recorded.
const (
	EngineDir   Engine = "dir"
	EngineBtrfs Engine = "btrfs"
	EngineAuto  Engine = "auto"
)

// FsTypes are the filesystems an image volume can be made with (fs_type,
// csi.storage.k8s.io/fstype), each with the smallest size its mkfs accepts
// (mkfs.xfs refuses filesystems under 300 MiB).
var FsTypes = map[string]int64{
	"ext4": 1 << 20,
	"xfs":  300 << 20,
}

// BlockBytes is the logical block size of the loop device behind every
// image and raw block volume (pkg/publish/loop): their sizes are multiples
// of it, so no partial block lies past the device's end.
const BlockBytes = 4096

// Volume is one CSI volume as the backends hand it to the CSI services
// (pkg/volume's records, pkg/cluster's LocalVolume objects).
type Volume struct {
	// ID is the driver-issued volume_id (see pkg/volume for its pattern).
	ID string
	// Name is the CSI CreateVolumeRequest.name it was created for; empty for
	// ephemeral inline volumes.
	Name string
	// CapacityBytes is the provisioned size in bytes.
	CapacityBytes int64
	// AccessType is AccessMount or AccessBlock.
	AccessType AccessType
	// FsType is an image volume's filesystem (a key of FsTypes); "" for a
	// directory volume and for raw block.
	FsType string
	// Parameters are the StorageClass parameters, csi.storage.k8s.io/ ones excluded.
	Parameters map[string]string
	// MutableParameters are the mutable parameters in effect (ParseMutable:
	// those of the create, then of each modify, merged), nil for none.
	MutableParameters map[string]string
	// SourceSnapshotID / SourceVolumeID name the content source, if any.
	SourceSnapshotID string
	SourceVolumeID   string
	// Ephemeral marks a CSI ephemeral inline volume; EphemeralID is the
	// volume_id the CO chose for it.
	Ephemeral   bool
	EphemeralID string
	// Engine is the storage engine holding the data ("dir", "btrfs").
	Engine Engine
	// CreatedAt is when the create was committed (UTC).
	CreatedAt time.Time
	// Node is the node id holding the volume (controller side only).
	Node string
	// KeySalt is the salt an encrypted directory volume's key is derived
	// with (pkg/volume/fscrypt), its source's for a restore or clone, so
	// that the same Secret unlocks every copy; nil for any other volume
	// (an image volume keeps its salt in its filesystem). Not secret.
	KeySalt []byte
	// FillFrom is the snapshot an encrypted directory volume restored
	// while its key was not on the node is filled from at its first
	// stage, which has the key; "" once filled, and for any other volume.
	FillFrom string
}

// Snapshot is one CSI snapshot as the backends hand it to the CSI services.
type Snapshot struct {
	// ID is the driver-issued snapshot_id.
	ID string
	// Name is the CSI CreateSnapshotRequest.name.
	Name string
	// SourceVolumeID is the volume_id it was taken of.
	SourceVolumeID string
	// SizeBytes is the source volume's capacity in bytes when it was taken.
	SizeBytes int64
	// AccessType is the source volume's access type.
	AccessType AccessType
	// FsType is the source volume's FsType.
	FsType string
	// Engine is the storage engine holding the data.
	Engine Engine
	// CreatedAt is when the snapshot was cut (UTC).
	CreatedAt time.Time
	// GroupSnapshotID is the group snapshot it was cut in, "" for none.
	GroupSnapshotID string
	// Node is the node id holding the snapshot (controller side only).
	Node string
	// Nodes are the nodes holding a complete, verified copy, Node first
	// (controller side only; nil: Node alone).
	Nodes []string
	// Copy marks a node's record of a snapshot cut on another node and
	// received from it (node side only).
	Copy bool
	// KeySalt is the source's Volume.KeySalt: set for a snapshot of an
	// encrypted directory volume.
	KeySalt []byte
}

// Image reports whether the volume's data is an image file (raw block, or
// a filesystem image volume) rather than a directory.
func (v *Volume) Image() bool { return v.AccessType == AccessBlock || v.FsType != "" }

// Image reports whether the snapshot's data is an image file.
func (s *Snapshot) Image() bool { return s.AccessType == AccessBlock || s.FsType != "" }

// EncryptedDir reports whether v is an encrypted directory volume: its
// directory carries an fscrypt policy once first staged.
func (v *Volume) EncryptedDir() bool { return !v.Image() && Encrypted(v.Parameters) }
