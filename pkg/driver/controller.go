package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// controller is the CSI Controller service (spec §Controller Service RPC).
// In all mode it works on the node-local volume manager directly.
type controller struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func (s *controller) topology() []*csi.Topology {
	return []*csi.Topology{{Segments: map[string]string{TopologyKey: s.d.opts.NodeID}}}
}

// reachable reports whether a topology requirement admits this node. With
// requisite topologies given, one must name this node; preferred ones alone
// are only a preference.
func (s *controller) reachable(req *csi.TopologyRequirement) bool {
	if len(req.GetRequisite()) == 0 {
		return true
	}
	for _, t := range req.GetRequisite() {
		if s.admits(t) {
			return true
		}
	}
	return false
}

// admits reports whether a topology segment set describes this node: every
// key it names must be one we have, with our value.
func (s *controller) admits(t *csi.Topology) bool {
	for k, v := range t.GetSegments() {
		if k != TopologyKey || v != s.d.opts.NodeID {
			return false
		}
	}
	return true
}

func (s *controller) csiVolume(v *state.Volume) *csi.Volume {
	out := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.CapacityBytes,
		AccessibleTopology: s.topology(),
	}
	if v.SourceSnapshotID != "" {
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID}}}
	} else if v.SourceVolumeID != "" {
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID}}}
	}
	return out
}

// CreateVolume provisions a volume on this node (spec §CreateVolume).
// Arguments are checked before any lookup; a repeated call with the same
// name and compatible arguments returns the existing volume, an incompatible
// one ALREADY_EXISTS. Codes: INVALID_ARGUMENT, ALREADY_EXISTS, OUT_OF_RANGE,
// RESOURCE_EXHAUSTED (no room, or the topology excludes this node), ABORTED
// (a call for the same name, or on the source volume, is in flight),
// NOT_FOUND (content source). With a content source and no capacity_range
// the volume gets the source's size; a smaller size is OUT_OF_RANGE, and a
// source of the other access type INVALID_ARGUMENT.
func (s *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCapsWellFormed(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	if cr := req.GetCapacityRange(); cr.GetRequiredBytes() < 0 || cr.GetLimitBytes() < 0 ||
		(cr.GetLimitBytes() > 0 && cr.GetRequiredBytes() > cr.GetLimitBytes()) {
		_, err := resolveSize(cr, s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes)
		return nil, err
	}
	release, err := s.d.names.acquire("volume name", req.GetName())
	if err != nil {
		return nil, err
	}
	defer release()

	existing, err := s.d.vm.LookupByName(req.GetName())
	if err != nil {
		return nil, toStatus(err)
	}
	if existing != nil {
		if why := compatible(existing, req); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists as %s and %s", req.GetName(), existing.ID, why)
		}
		return &csi.CreateVolumeResponse{Volume: s.csiVolume(existing)}, nil
	}

	for _, c := range req.GetVolumeCapabilities() {
		if p := capProblem(c); p != "" {
			return nil, invalid("%s", p)
		}
	}
	params, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	srcSnap, srcVol, srcSize, err := s.source(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	size := srcSize
	if req.GetCapacityRange() != nil || srcSize == 0 {
		if size, err = resolveSize(req.GetCapacityRange(), s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes); err != nil {
			return nil, err
		}
	}
	if !s.reachable(req.GetAccessibilityRequirements()) {
		return nil, status.Errorf(codes.ResourceExhausted, "accessibility_requirements exclude node %q, the only node this controller serves", s.d.opts.NodeID)
	}
	if srcVol != "" {
		// The source must not be deleted while it is copied.
		release, err := s.d.ids.acquire("volume", srcVol)
		if err != nil {
			return nil, err
		}
		defer release()
	}
	v, err := s.d.vm.Create(volume.CreateSpec{
		Name:             req.GetName(),
		SizeBytes:        size,
		AccessType:       accessTypeOf(req.GetVolumeCapabilities()),
		Parameters:       userParams(req.GetParameters()),
		DirMode:          params.dirMode,
		SourceSnapshotID: srcSnap,
		SourceVolumeID:   srcVol,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.CreateVolumeResponse{Volume: s.csiVolume(v)}, nil
}

// source resolves a CreateVolume content source to a snapshot or volume id
// and its size in bytes. Codes: NOT_FOUND for a source that does not exist
// on this node (an id of any other shape included), INVALID_ARGUMENT for an
// empty or unknown source type.
func (s *controller) source(src *csi.VolumeContentSource) (snapID, volID string, size int64, err error) {
	switch {
	case src == nil:
		return "", "", 0, nil
	case src.GetSnapshot() != nil:
		snap, err := s.d.vm.GetSnapshot(src.GetSnapshot().GetSnapshotId())
		if err != nil {
			return "", "", 0, toStatus(err)
		}
		return snap.ID, "", snap.SizeBytes, nil
	case src.GetVolume() != nil:
		v, err := s.d.vm.Get(src.GetVolume().GetVolumeId())
		if err != nil {
			return "", "", 0, toStatus(err)
		}
		return "", v.ID, v.CapacityBytes, nil
	}
	return "", "", 0, invalid("volume_content_source has no snapshot or volume")
}

// DeleteVolume removes a volume and its data (spec §DeleteVolume). Unknown
// ids succeed. Codes: INVALID_ARGUMENT (no id), FAILED_PRECONDITION (still
// mounted on the node), ABORTED (another call on this id is in flight).
func (s *controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume_id is required")
	}
	if !volume.ValidVolumeID(id) {
		return &csi.DeleteVolumeResponse{}, nil // never issued by us: nothing to delete
	}
	release, err := s.d.ids.acquire("volume", id)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := s.d.vm.Delete(id); err != nil {
		return nil, toStatus(err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms the capabilities this volume supports
// (spec §ValidateVolumeCapabilities): confirmed is set only when every
// capability is supported. Codes: INVALID_ARGUMENT, NOT_FOUND.
func (s *controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := checkCapsWellFormed(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	v, err := s.d.vm.Get(req.GetVolumeId())
	if err != nil {
		return nil, toStatus(err)
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	for _, c := range req.GetVolumeCapabilities() {
		if p := capProblem(c); p != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: p}, nil
		}
		if at := accessTypeOf([]*csi.VolumeCapability{c}); at != v.AccessType {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s is a %s volume, not %s", v.ID, v.AccessType, at)}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes pages through the volumes in id order (spec §ListVolumes).
// Tokens are opaque. Codes: INVALID_ARGUMENT (negative max_entries),
// ABORTED (a token this driver did not issue).
func (s *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, invalid("max_entries must not be negative")
	}
	after, err := decodeToken(req.GetStartingToken(), volume.ValidVolumeID)
	if err != nil {
		return nil, err
	}
	vols, next, err := s.d.vm.List(after, int(req.GetMaxEntries()))
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &csi.ListVolumesResponse{NextToken: encodeToken(next)}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.csiVolume(v)})
	}
	return resp, nil
}

// ControllerGetVolume returns one volume (spec
// §ControllerGetVolume). Codes: INVALID_ARGUMENT, NOT_FOUND.
func (s *controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	v, err := s.d.vm.Get(req.GetVolumeId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

// GetCapacity reports the bytes still available for new volumes on this
// node: min(capacity − Σ volume sizes, free space), and the largest volume
// that may be requested (spec §GetCapacity). Capabilities or a topology this
// node cannot serve get 0. Codes: INVALID_ARGUMENT (malformed capability or
// unknown parameter).
func (s *controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	for _, c := range req.GetVolumeCapabilities() {
		if err := checkCapWellFormed(c); err != nil {
			return nil, err
		}
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return nil, err
	}
	zero := &csi.GetCapacityResponse{AvailableCapacity: 0, MaximumVolumeSize: wrapperspb.Int64(0)}
	if t := req.GetAccessibleTopology(); t != nil && !s.admits(t) {
		return zero, nil
	}
	for _, c := range req.GetVolumeCapabilities() {
		if capProblem(c) != "" {
			return zero, nil
		}
	}
	ci, err := s.d.vm.Capacity()
	if err != nil {
		return nil, toStatus(err)
	}
	maxVol := ci.Available
	if m := s.d.opts.MaxVolumeBytes; m > 0 {
		maxVol = min(maxVol, m)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: ci.Available, MaximumVolumeSize: wrapperspb.Int64(maxVol)}, nil
}

// ControllerGetCapabilities advertises what this build implements.
func (s *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_GET_VOLUME,
		csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
		csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
		csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}
