package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Backend is what the Controller service works on: the node's Store in all
// mode (LocalBackend), pkg/cluster's custom resources in controller mode. The
// service keeps the CSI semantics; the backend places and stores. Errors
// wrap the contract sentinels.
type Backend interface {
	// VolumeByName returns the volume created for a CSI name, or nil.
	VolumeByName(ctx context.Context, name string) (*contract.Volume, error)
	// Volume returns a volume (ErrNotFound).
	Volume(ctx context.Context, id string) (*contract.Volume, error)
	// ListVolumes pages through volumes in id order.
	ListVolumes(ctx context.Context, after string, limit int) ([]*contract.Volume, string, error)
	// CreateVolume places and creates a volume within topology; ErrNoSpace
	// when no admissible node has room or holds the content source.
	CreateVolume(ctx context.Context, spec contract.CreateSpec, topology *csi.TopologyRequirement) (*contract.Volume, error)
	// DeleteVolume deletes a volume; unknown ids succeed.
	DeleteVolume(ctx context.Context, id string) error
	// ExpandVolume grows a volume to size bytes; returns the new capacity.
	ExpandVolume(ctx context.Context, id string, size int64) (int64, error)
	// ModifyVolume applies mutable parameters to a volume (only the keys
	// given); ErrInvalid for one the volume cannot take.
	ModifyVolume(ctx context.Context, id string, params map[string]string) error
	// Capacity returns the bytes available for new volumes in a topology
	// segment (nil: the whole backend), and the largest single volume.
	Capacity(ctx context.Context, segment *csi.Topology) (available, largest int64, err error)
	// VolumeHealth checks one volume.
	VolumeHealth(ctx context.Context, id string) (contract.Health, error)

	// SnapshotByName returns the snapshot created for a CSI name, or nil.
	SnapshotByName(ctx context.Context, name string) (*contract.Snapshot, error)
	// Snapshot returns a snapshot (ErrNotFound).
	Snapshot(ctx context.Context, id string) (*contract.Snapshot, error)
	// ListSnapshots pages through snapshots in id order, optionally of one
	// source volume.
	ListSnapshots(ctx context.Context, after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error)
	// CreateSnapshot snapshots a volume on its node, and keeps it on
	// copies-1 other nodes too (copies <= 1: its node only).
	CreateSnapshot(ctx context.Context, name, sourceVolumeID string, topology *csi.TopologyRequirement, copies int) (*contract.Snapshot, error)
	// DeleteSnapshot deletes a snapshot; unknown ids succeed.
	DeleteSnapshot(ctx context.Context, id string) error
}

// LocalBackend serves the Controller service from this node's volumes and
// snapshots (all mode): one node, the driver's own.
type LocalBackend struct {
	Volumes   Volumes
	Snapshots Snapshots
	NodeID    string
	// MaxVolumeBytes caps single volumes (0: no cap but the capacity).
	MaxVolumeBytes int64
}

var _ Backend = (*LocalBackend)(nil)

func (b *LocalBackend) v(v *contract.Volume, err error) (*contract.Volume, error) {
	if v != nil {
		v.Node = b.NodeID
	}
	return v, err
}

func (b *LocalBackend) s(s *contract.Snapshot, err error) (*contract.Snapshot, error) {
	if s != nil {
		s.Node = b.NodeID
	}
	return s, err
}

// VolumeByName implements Backend.
func (b *LocalBackend) VolumeByName(_ context.Context, name string) (*contract.Volume, error) {
	return b.v(b.Volumes.LookupByName(name))
}

// Volume implements Backend.
func (b *LocalBackend) Volume(_ context.Context, id string) (*contract.Volume, error) {
	return b.v(b.Volumes.Get(id))
}

// ListVolumes implements Backend.
func (b *LocalBackend) ListVolumes(_ context.Context, after string, limit int) ([]*contract.Volume, string, error) {
	vols, next, err := b.Volumes.List(after, limit)
	for _, v := range vols {
		v.Node = b.NodeID
	}
	return vols, next, err
}

// CreateVolume implements Backend.
func (b *LocalBackend) CreateVolume(_ context.Context, spec contract.CreateSpec, topology *csi.TopologyRequirement) (*contract.Volume, error) {
	if !contract.Reachable(topology, b.NodeID) {
		return nil, fmt.Errorf("%w: accessibility_requirements exclude node %q, the only node this controller serves", contract.ErrNoSpace, b.NodeID)
	}
	return b.v(b.Volumes.Create(spec))
}

// DeleteVolume implements Backend.
func (b *LocalBackend) DeleteVolume(_ context.Context, id string) error { return b.Volumes.Delete(id) }

// ExpandVolume implements Backend.
func (b *LocalBackend) ExpandVolume(_ context.Context, id string, size int64) (int64, error) {
	return b.Volumes.Expand(id, size)
}

// ModifyVolume implements Backend.
func (b *LocalBackend) ModifyVolume(_ context.Context, id string, params map[string]string) error {
	_, err := b.Volumes.Modify(id, params)
	return err
}

// Capacity implements Backend.
func (b *LocalBackend) Capacity(_ context.Context, segment *csi.Topology) (int64, int64, error) {
	if segment != nil && !contract.Admits(segment, b.NodeID) {
		return 0, 0, nil
	}
	ci, err := b.Volumes.Capacity()
	if err != nil {
		return 0, 0, err
	}
	largest := ci.Available
	if b.MaxVolumeBytes > 0 {
		largest = min(largest, b.MaxVolumeBytes)
	}
	return ci.Available, largest, nil
}

// VolumeHealth implements Backend.
func (b *LocalBackend) VolumeHealth(_ context.Context, id string) (contract.Health, error) {
	return b.Volumes.Health(id)
}

// SnapshotByName implements Backend.
func (b *LocalBackend) SnapshotByName(_ context.Context, name string) (*contract.Snapshot, error) {
	return b.s(b.Snapshots.LookupByName(name))
}

// Snapshot implements Backend.
func (b *LocalBackend) Snapshot(_ context.Context, id string) (*contract.Snapshot, error) {
	return b.s(b.Snapshots.Get(id))
}

// ListSnapshots implements Backend.
func (b *LocalBackend) ListSnapshots(_ context.Context, after string, limit int, src string) ([]*contract.Snapshot, string, error) {
	snaps, next, err := b.Snapshots.List(after, limit, src)
	for _, s := range snaps {
		s.Node = b.NodeID
	}
	return snaps, next, err
}

// CreateSnapshot implements Backend.
func (b *LocalBackend) CreateSnapshot(_ context.Context, name, src string, topology *csi.TopologyRequirement, copies int) (*contract.Snapshot, error) {
	if copies > 1 {
		return nil, fmt.Errorf("%w: the snapshot parameter copies needs cluster mode: all mode has one node", contract.ErrInvalid)
	}
	if !contract.Reachable(topology, b.NodeID) {
		return nil, fmt.Errorf("%w: accessibility_requirements exclude node %q, where the source volume lives", contract.ErrNoSpace, b.NodeID)
	}
	return b.s(b.Snapshots.Create(contract.SnapshotSpec{Name: name, SourceVolumeID: src}))
}

// DeleteSnapshot implements Backend.
func (b *LocalBackend) DeleteSnapshot(_ context.Context, id string) error {
	return b.Snapshots.Delete(id)
}
