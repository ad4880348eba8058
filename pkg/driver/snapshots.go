package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// Controller RPCs for snapshots, expansion and volume health.

// csiSnapshot converts a record. A snapshot lives on the node of its
// source; CreateSnapshot honours accessibility_requirements
// (SNAPSHOT_ACCESSIBILITY_CONSTRAINTS), but the optional accessible_topology
// is left out of the reply: csi-sanity v5.6.0 compares it with reflect-based
// equality against a proto that was already marshalled (its internal size
// cache differs), so any value fails, and no CO consumes it yet.
func (c *controller) csiSnapshot(s *state.Snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}

// snapshotNameKey keeps snapshot names apart from volume names in the
// shared name lock set.
func snapshotNameKey(name string) string { return "snapshot/" + name }

// CreateSnapshot snapshots a volume (spec §CreateSnapshot). The snapshot is
// ready when the call returns (ready_to_use is always true) and stays usable
// after its source is deleted. A repeated call with the same name and
// source returns the same snapshot. It locks the snapshot name and the
// source volume only: snapshots of one volume never block other volumes.
// Codes: INVALID_ARGUMENT (no name or source, unknown parameter),
// ALREADY_EXISTS (name taken for another source), NOT_FOUND (source),
// RESOURCE_EXHAUSTED (disk full), ABORTED (call on the name or the source
// in flight).
func (s *controller) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if req.GetSourceVolumeId() == "" {
		return nil, invalid("source_volume_id is required")
	}
	for k := range userParams(req.GetParameters()) {
		return nil, invalid("unknown snapshot parameter %q (the driver takes none besides the %s* ones); remove it from the VolumeSnapshotClass", k, reservedPrefix)
	}
	release, err := s.d.names.acquire("snapshot name", snapshotNameKey(req.GetName()))
	if err != nil {
		return nil, err
	}
	defer release()
	existing, err := s.d.backend.SnapshotByName(ctx, req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	if existing != nil {
		if existing.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q already exists as %s of volume %s, not of %s",
				req.GetName(), existing.ID, existing.SourceVolumeID, req.GetSourceVolumeId())
		}
		return &csi.CreateSnapshotResponse{Snapshot: s.csiSnapshot(existing)}, nil
	}
	if !volume.ValidVolumeID(req.GetSourceVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "source volume %q not found", req.GetSourceVolumeId())
	}
	releaseSrc, err := s.d.ids.acquire("volume", req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	defer releaseSrc()
	snap, err := s.d.backend.CreateSnapshot(ctx, req.GetName(), req.GetSourceVolumeId(), req.GetAccessibilityRequirements())
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.CreateSnapshotResponse{Snapshot: s.csiSnapshot(snap)}, nil
}

// DeleteSnapshot removes a snapshot (spec §DeleteSnapshot); unknown ids
// succeed. Volumes restored from it are unaffected. Codes:
// INVALID_ARGUMENT, ABORTED.
func (s *controller) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, invalid("snapshot_id is required")
	}
	if !volume.ValidSnapshotID(id) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	release, err := s.d.ids.acquire("snapshot", id)
	if err != nil {
		return nil, err
	}
	defer release()
	return &csi.DeleteSnapshotResponse{}, toStatus(s.d.backend.DeleteSnapshot(ctx, id))
}

// ListSnapshots pages through snapshots in id order, optionally filtered by
// snapshot_id (an unknown one gives an empty list) or source_volume_id
// (spec §ListSnapshots). Codes: INVALID_ARGUMENT, ABORTED (foreign token).
func (s *controller) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	after, err := decodeToken(req.GetStartingToken(), volume.ValidSnapshotID)
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
			resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.csiSnapshot(snap)})
		}
		return resp, nil
	}
	snaps, next, err := s.d.backend.ListSnapshots(ctx, after, int(req.GetMaxEntries()), req.GetSourceVolumeId())
	if err != nil {
		return nil, toStatus(err)
	}
	resp.NextToken = encodeToken(next)
	for _, snap := range snaps {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s.csiSnapshot(snap)})
	}
	return resp, nil
}

// GetSnapshot returns one snapshot (spec §GetSnapshot). Codes:
// INVALID_ARGUMENT, NOT_FOUND.
func (s *controller) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, invalid("snapshot_id is required")
	}
	snap, err := s.d.backend.Snapshot(ctx, req.GetSnapshotId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.GetSnapshotResponse{Snapshot: s.csiSnapshot(snap)}, nil
}

// ControllerExpandVolume grows a volume online (spec
// §ControllerExpandVolume): the btrfs qgroup limit is raised or the image
// grown; a block volume then needs NodeExpandVolume to refresh its loop
// device. A required_bytes at or below the current size (or none, with a
// limit_bytes the current size fits) succeeds with the current size.
// Codes: INVALID_ARGUMENT (no id, no capacity_range, or neither
// required_bytes nor limit_bytes), NOT_FOUND, OUT_OF_RANGE (above
// --max-volume-size, or a current size above limit_bytes: volumes never
// shrink), RESOURCE_EXHAUSTED (no room for the growth; OUT_OF_RANGE is
// kept for the per-volume maximum, case C23), ABORTED.
func (s *controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	cr := req.GetCapacityRange()
	if cr == nil {
		return nil, invalid("capacity_range is required")
	}
	if cr.GetRequiredBytes() == 0 && cr.GetLimitBytes() == 0 {
		return nil, invalid("capacity_range needs required_bytes or limit_bytes")
	}
	// size stays 0 when no growth is asked for (only a limit_bytes);
	// resolveSize checks the signs and the range otherwise.
	var size int64
	if cr.GetRequiredBytes() != 0 || cr.GetLimitBytes() < 0 {
		var err error
		if size, err = resolveSize(cr, 0, s.d.opts.MaxVolumeBytes); err != nil {
			return nil, err
		}
	}
	release, err := s.d.ids.acquire("volume", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, toStatus(err)
	}
	if c := req.GetVolumeCapability(); c != nil && accessTypeOf([]*csi.VolumeCapability{c}) != v.AccessType {
		return nil, invalid("volume %s is a %s volume; volume_capability asks for another access type", v.ID, v.AccessType)
	}
	if lim := cr.GetLimitBytes(); lim > 0 && v.CapacityBytes > lim {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %d bytes, above limit_bytes %d; volumes cannot shrink", v.ID, v.CapacityBytes, lim)
	}
	capacity := v.CapacityBytes
	if size > 0 {
		capacity, err = s.d.backend.ExpandVolume(ctx, v.ID, size)
		if err != nil {
			return nil, toStatus(err)
		}
	}
	return &csi.ControllerExpandVolumeResponse{
		CapacityBytes:         capacity,
		NodeExpansionRequired: v.AccessType == state.AccessBlock,
	}, nil
}

func csiHealth(id string, h volume.Health) *csi.VolumeHealth {
	out := &csi.VolumeHealth{VolumeId: id}
	kinds := map[string]csi.VolumeHealthErrorType{
		"Degraded":     csi.VolumeHealthErrorType_DEGRADED,
		"Inaccessible": csi.VolumeHealthErrorType_INACCESSIBLE,
		"DataLoss":     csi.VolumeHealthErrorType_DATA_LOSS,
	}
	for _, p := range h.Problems {
		out.HealthStatuses = append(out.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: kinds[p.Kind], Reason: p.Reason, Message: p.Message,
		})
	}
	return out
}

// ControllerGetVolumeHealth reports problems of one volume: data missing
// (DATA_LOSS), usage above capacity on the dir engine (DEGRADED). A healthy
// volume has no entries. Codes: INVALID_ARGUMENT, NOT_FOUND. No lock: it
// only reads.
func (s *controller) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	h, err := s.d.backend.VolumeHealth(ctx, req.GetVolumeId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: csiHealth(req.GetVolumeId(), h)}, nil
}

// ControllerListVolumeHealth pages through the volumes' health like
// ListVolumes. Codes: INVALID_ARGUMENT, ABORTED (foreign token).
func (s *controller) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	after, err := decodeToken(req.GetStartingToken(), volume.ValidVolumeID)
	if err != nil {
		return nil, err
	}
	vols, next, err := s.d.backend.ListVolumes(ctx, after, int(req.GetMaxEntries()))
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: encodeToken(next)}
	for _, v := range vols {
		h, err := s.d.backend.VolumeHealth(ctx, v.ID)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Entries = append(resp.Entries, csiHealth(v.ID, h))
	}
	return resp, nil
}
