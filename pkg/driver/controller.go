package driver

import (
	"context"
	"fmt"
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// controller is the CSI Controller service (spec §Controller Service RPC).
// In all mode it works on the node's Store (LocalBackend).
type controller struct {
	csi.UnimplementedControllerServer
	d *Driver
}

func topologyOf(node string) []*csi.Topology {
	return []*csi.Topology{{Segments: map[string]string{TopologyKey: node}}}
}

func (s *controller) csiVolume(v *contract.Volume) *csi.Volume {
	out := &csi.Volume{
		VolumeId:           v.ID,
		CapacityBytes:      v.CapacityBytes,
		AccessibleTopology: topologyOf(v.Node),
	}
	if v.SourceSnapshotID != "" {
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID}}}
	} else if v.SourceVolumeID != "" {
		out.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID}}}
	}
	return out
}

// CreateVolume validates the request, resolves the size (resolveCreateSize,
// fitFsType) and has the backend create the volume. A repeated call with the
// same name and compatible arguments returns the existing volume, an
// incompatible one is ALREADY_EXISTS (compatible). ABORTED while a call for
// the same name, or on the source volume, is in flight.
func (s *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities are required")
	}
	if i := judgeCaps(req.GetVolumeCapabilities(), nil); i != nil {
		return nil, i.err()
	}
	if cr := req.GetCapacityRange(); cr.GetRequiredBytes() < 0 || cr.GetLimitBytes() < 0 ||
		(cr.GetLimitBytes() > 0 && cr.GetRequiredBytes() > cr.GetLimitBytes()) {
		_, err := resolveSize(cr, s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes)
		return nil, err
	}
	release, err := s.d.names.Acquire("volume name", req.GetName())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()

	existing, err := s.d.backend.VolumeByName(ctx, req.GetName())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if existing != nil {
		if why := compatible(existing, req); why != "" {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists as %s and %s", req.GetName(), existing.ID, why)
		}
		return &csi.CreateVolumeResponse{Volume: s.csiVolume(existing)}, nil
	}

	params, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	if err := contract.CheckEncryption(params, accessTypeOf(req.GetVolumeCapabilities()), fsTypeOf(req.GetVolumeCapabilities())); err != nil {
		return nil, err
	}
	if err := contract.CheckMutableKind("", accessTypeOf(req.GetVolumeCapabilities()), fsTypeOf(req.GetVolumeCapabilities()), req.GetMutableParameters()); err != nil {
		return nil, contract.ToStatus(err)
	}
	srcSnap, srcVol, srcSize, err := s.source(ctx, req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	fsType := fsTypeOf(req.GetVolumeCapabilities())
	size, err := resolveCreateSize(req.GetCapacityRange(), srcSize, s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes)
	if err != nil {
		return nil, err
	}
	if size, err = fitFsType(size, fsType, req.GetCapacityRange().GetLimitBytes(), s.d.opts.MaxVolumeBytes); err != nil {
		return nil, err
	}
	if fsType != "" || accessTypeOf(req.GetVolumeCapabilities()) == contract.AccessBlock {
		if size, err = alignBlocks(size, req.GetCapacityRange()); err != nil {
			return nil, err
		}
	}
	if srcVol != "" {
		// The source must not be deleted while it is copied.
		release, err := s.d.ids.Acquire("volume", srcVol)
		if err != nil {
			return nil, contract.ToStatus(err)
		}
		defer release()
	}
	v, err := s.d.backend.CreateVolume(ctx, contract.CreateSpec{
		Name:              req.GetName(),
		SizeBytes:         size,
		AccessType:        accessTypeOf(req.GetVolumeCapabilities()),
		FsType:            fsType,
		Parameters:        userParams(req.GetParameters()),
		DirMode:           params.DirMode,
		MutableParameters: maps.Clone(req.GetMutableParameters()),
		SourceSnapshotID:  srcSnap,
		SourceVolumeID:    srcVol,
		PVCNamespace:      req.GetParameters()[contract.ParamPVCNamespace],
		PVCName:           req.GetParameters()[contract.ParamPVCName],
	}, req.GetAccessibilityRequirements())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.CreateVolumeResponse{Volume: s.csiVolume(v)}, nil
}

// source resolves a content source to a snapshot or volume id and its size:
// NOT_FOUND for an unknown source, INVALID_ARGUMENT for an empty one.
func (s *controller) source(ctx context.Context, src *csi.VolumeContentSource) (snapID, volID string, size int64, err error) {
	switch {
	case src == nil:
		return "", "", 0, nil
	case src.GetSnapshot() != nil:
		snap, err := s.d.backend.Snapshot(ctx, src.GetSnapshot().GetSnapshotId())
		if err != nil {
			return "", "", 0, contract.ToStatus(err)
		}
		return snap.ID, "", snap.SizeBytes, nil
	case src.GetVolume() != nil:
		v, err := s.d.backend.Volume(ctx, src.GetVolume().GetVolumeId())
		if err != nil {
			return "", "", 0, contract.ToStatus(err)
		}
		return "", v.ID, v.CapacityBytes, nil
	}
	return "", "", 0, invalid("volume_content_source has no snapshot or volume")
}

// DeleteVolume deletes a volume; unknown ids succeed. ABORTED while another
// call on the id is in flight.
func (s *controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, invalid("volume_id is required")
	}
	if !contract.ValidVolumeID(id) {
		return &csi.DeleteVolumeResponse{}, nil // never issued by us: nothing to delete
	}
	release, err := s.d.ids.Acquire("volume", id)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	if err := s.d.backend.DeleteVolume(ctx, id); err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms only when judgeCaps accepts every
// capability and the given parameters and volume_context are the volume's;
// otherwise message says why.
func (s *controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, invalid("volume_capabilities are required")
	}
	if i := judgeCaps(req.GetVolumeCapabilities(), nil); i != nil && i.malformed {
		return nil, i.err()
	}
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
	}
	if i := judgeCaps(req.GetVolumeCapabilities(), v); i != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s: %s", v.ID, i.msg)}, nil
	}
	// Other parameters are not confirmed: a CreateVolume of its name with them
	// would be ALREADY_EXISTS.
	if len(req.GetParameters()) > 0 && !maps.Equal(v.Parameters, userParams(req.GetParameters())) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s was created with other parameters than %v", v.ID, userParams(req.GetParameters()))}, nil
	}
	if vc := req.GetVolumeContext(); len(vc) > 0 && !maps.Equal(vc, s.csiVolume(v).GetVolumeContext()) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("volume %s has another volume_context than the request's", v.ID)}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes: see volumePage.
func (s *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	vols, next, err := s.volumePage(ctx, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: s.csiVolume(v)})
	}
	return resp, nil
}

// volumePage is one page of volumes in id order (ListVolumes,
// ControllerListVolumeHealth) and the opaque token of the next ("" at the
// end). INVALID_ARGUMENT for a negative max_entries, ABORTED for a foreign token.
func (s *controller) volumePage(ctx context.Context, maxEntries int32, token string) ([]*contract.Volume, string, error) {
	if maxEntries < 0 {
		return nil, "", invalid("max_entries must not be negative")
	}
	after, err := decodeToken(token, contract.ValidVolumeID)
	if err != nil {
		return nil, "", err
	}
	vols, next, err := s.d.backend.ListVolumes(ctx, after, int(maxEntries))
	if err != nil {
		return nil, "", contract.ToStatus(err)
	}
	return vols, encodeToken(next), nil
}

// ControllerGetVolume returns one volume.
func (s *controller) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{},
	}, nil
}

// GetCapacity reports the backend's Capacity for the requested topology
// segment. Capabilities judgeCaps refuses get 0; malformed ones, and unknown
// parameters, are INVALID_ARGUMENT.
func (s *controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	issue := judgeCaps(req.GetVolumeCapabilities(), nil)
	if issue != nil && issue.malformed {
		return nil, issue.err()
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return nil, err
	}
	if issue != nil {
		return &csi.GetCapacityResponse{MaximumVolumeSize: wrapperspb.Int64(0)}, nil
	}
	avail, largest, err := s.d.backend.Capacity(ctx, req.GetAccessibleTopology())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
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
		csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	} {
		caps = append(caps, rpcCap(t))
	}
	if _, ok := s.d.backend.(publisher); ok {
		caps = append(caps, rpcCap(csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME))
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

func rpcCap(t csi.ControllerServiceCapability_RPC_Type) *csi.ControllerServiceCapability {
	return &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}}
}

// publisher is implemented by backends whose volumes must be checked
// against the node a CO attaches them to (controller mode).
type publisher interface {
	// NodeKnown reports whether the node runs the localdir node plugin.
	NodeKnown(ctx context.Context, node string) (bool, error)
}

// ControllerPublishVolume checks that the volume lives on the node the CO
// wants it on (nothing to attach), in controller mode, where csi-attacher may
// run; the capability is judged as for the node calls.
func (s *controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	p, ok := s.d.backend.(publisher)
	if !ok {
		return nil, status.Error(codes.Unimplemented, "ControllerPublishVolume is not needed in all mode")
	}
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetNodeId() == "" {
		return nil, invalid("node_id is required")
	}
	if i := judgeCaps([]*csi.VolumeCapability{req.GetVolumeCapability()}, nil); i != nil && i.malformed {
		return nil, i.err()
	}
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	known, err := p.NodeKnown(ctx, req.GetNodeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if !known {
		return nil, status.Errorf(codes.NotFound, "node %q does not run the localdir node plugin", req.GetNodeId())
	}
	if v.Node != req.GetNodeId() {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s lives on node %q, not on %q: local volumes cannot move", v.ID, v.Node, req.GetNodeId())
	}
	if err := checkNodeCap(req.GetVolumeCapability(), v); err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{}, nil
}

// ControllerUnpublishVolume has nothing to detach; it succeeds once the
// arguments are valid (spec §ControllerUnpublishVolume).
func (s *controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if _, ok := s.d.backend.(publisher); !ok {
		return nil, status.Error(codes.Unimplemented, "ControllerUnpublishVolume is not needed in all mode")
	}
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
