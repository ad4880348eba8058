package driver

import (
	"context"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// csiSnapshot converts a record; with topology, accessible_topology names
// the nodes that hold a complete copy (cluster mode: all mode has one node
// and names none). CreateSnapshot leaves it out, as only the snapshot's own
// node holds it then: csi-sanity v5.6.0 compares each of its entries with
// reflect.DeepEqual against a message it marshalled (whose size cache
// differs), so any value fails there.
func (c *controller) csiSnapshot(s *contract.Snapshot, topology bool) *csi.Snapshot {
	var topo []*csi.Topology
	if topology {
		nodes := s.Nodes
		if len(nodes) == 0 && s.Node != "" {
			nodes = []string{s.Node}
		}
		for _, n := range nodes {
			topo = append(topo, topologyOf(n)...)
		}
	}
	return &csi.Snapshot{
		AccessibleTopology: topo,
		SnapshotId:         s.ID,
		SourceVolumeId:     s.SourceVolumeID,
		SizeBytes:          s.SizeBytes,
		CreationTime:       timestamppb.New(s.CreatedAt),
		ReadyToUse:         true,
		GroupSnapshotId:    s.GroupSnapshotID,
	}
}

// SnapshotCopiesParam is the VolumeSnapshotClass parameter naming how many
// nodes keep each snapshot: 1 (its volume's node, the default) to
// maxSnapshotCopies.
const SnapshotCopiesParam = "copies"

const maxSnapshotCopies = 3

// SnapshotCopies parses a VolumeSnapshotClass's parameters (a
// CreateSnapshot's): copies, and no other besides the reserved
// csi.storage.k8s.io/* ones. Errors: INVALID_ARGUMENT naming the key.
func SnapshotCopies(params map[string]string) (int, error) {
	copies := 1
	for k, v := range userParams(params) {
		if k != SnapshotCopiesParam {
			return 0, invalid("unknown snapshot parameter %q (the driver takes %s and the %s* ones); remove it from the VolumeSnapshotClass", k, SnapshotCopiesParam, reservedPrefix)
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSnapshotCopies {
			return 0, invalid("snapshot parameter %s=%q: want a whole number from 1 to %d (the nodes that keep each snapshot)", k, v, maxSnapshotCopies)
		}
		copies = n
	}
	return copies, nil
}

// snapshotNameKey keeps snapshot names apart from volume names in the
// shared name lock set.
func snapshotNameKey(name string) string { return "snapshot/" + name }

// CreateSnapshot snapshots a volume through the backend. A repeated call with
// the same name and source returns the same snapshot; another source is
// ALREADY_EXISTS. It locks the name and the source volume only: snapshots of
// one volume never block other volumes.
func (s *controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetSourceVolumeId() == "" {
		return nil, invalid("source_volume_id is required")
	}
	copies, err := SnapshotCopies(req.GetParameters())
	if err != nil {
		return nil, err
	}
	release, err := s.d.names.Acquire("snapshot name", snapshotNameKey(req.GetName()))
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	existing, err := s.d.backend.SnapshotByName(ctx, req.GetName())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if existing != nil {
		if existing.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q already exists as %s of volume %s, not of %s",
				req.GetName(), existing.ID, existing.SourceVolumeID, req.GetSourceVolumeId())
		}
		return &csi.CreateSnapshotResponse{Snapshot: s.csiSnapshot(existing, false)}, nil
	}
	if !contract.ValidVolumeID(req.GetSourceVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "source volume %q not found", req.GetSourceVolumeId())
	}
	releaseSrc, err := s.d.ids.Acquire("volume", req.GetSourceVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer releaseSrc()
	snap, err := s.d.backend.CreateSnapshot(ctx, req.GetName(), req.GetSourceVolumeId(), req.GetAccessibilityRequirements(), copies)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: s.csiSnapshot(snap, false)}, nil
}

// DeleteSnapshot deletes a snapshot; unknown ids succeed.
func (s *controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot_id is required")
	}
	if !contract.ValidSnapshotID(id) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	release, err := s.d.ids.Acquire("snapshot", id)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	return &csi.DeleteSnapshotResponse{}, contract.ToStatus(s.d.backend.DeleteSnapshot(ctx, id))
}

// ListSnapshots pages through snapshots in id order, optionally filtered by
// snapshot_id (an unknown one: no entries) or source_volume_id.
func (s *controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	after, err := decodeToken(req.GetStartingToken(), contract.ValidSnapshotID)
	if err != nil {
		return nil, err
	}
	resp := &csi.ListSnapshotsResponse{}
	if id := req.GetSnapshotId(); id != "" {
		snap, err := s.d.backend.Snapshot(ctx, id)
		if err != nil {
			return resp, nil // not found: no entries
		}
		if src := req.GetSourceVolumeId(); src == "" || src == snap.SourceVolumeID {
			resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.csiSnapshot(snap, true)})
		}
		return resp, nil
	}
	snaps, next, err := s.d.backend.ListSnapshots(ctx, after, int(req.GetMaxEntries()), req.GetSourceVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	resp.NextToken = encodeToken(next)
	for _, snap := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.csiSnapshot(snap, true)})
	}
	return resp, nil
}

// GetSnapshot returns one snapshot.
func (s *controller) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, invalid("snapshot_id is required")
	}
	snap, err := s.d.backend.Snapshot(ctx, req.GetSnapshotId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.GetSnapshotResponse{Snapshot: s.csiSnapshot(snap, true)}, nil
}
