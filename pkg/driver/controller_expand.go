package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// ControllerExpandVolume grows a volume (backend ExpandVolume); an image or
// block volume then needs NodeExpandVolume. A required_bytes the current size
// meets, or only a limit_bytes it fits, succeeds with the current size;
// volumes never shrink (OUT_OF_RANGE). A size no retry can reach (above
// the per-volume maximum, case C23, or above the node's whole capacity) is
// OUT_OF_RANGE, which Kubernetes marks ControllerResizeInfeasible so the
// user may lower the request; no room now is RESOURCE_EXHAUSTED, retried.
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
	release, err := s.d.ids.Acquire("volume", req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if c := req.GetVolumeCapability(); c != nil && accessTypeOf([]*csi.VolumeCapability{c}) != v.AccessType {
		return nil, invalid("volume %s is a %s volume; volume_capability asks for another access type", v.ID, v.AccessType)
	}
	if lim := cr.GetLimitBytes(); lim > 0 && v.CapacityBytes > lim {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %d bytes, above limit_bytes %d; volumes cannot shrink", v.ID, v.CapacityBytes, lim)
	}
	if size > 0 && v.Image() {
		if size, err = alignBlocks(size, cr); err != nil {
			return nil, err
		}
	}
	capacity := v.CapacityBytes
	if size > 0 {
		capacity, err = s.d.backend.ExpandVolume(ctx, v.ID, size)
		if err != nil {
			return nil, contract.ToStatus(err)
		}
	}
	return &csi.ControllerExpandVolumeResponse{
		CapacityBytes:         capacity,
		NodeExpansionRequired: v.Image(),
	}, nil
}

// ControllerModifyVolume applies the mutable parameters given
// (contract.CheckMutableKind, then the backend). INVALID_ARGUMENT makes the
// CO mark the modify infeasible; UNAVAILABLE or DEADLINE_EXCEEDED (the node
// plugin did not answer) make it retry.
func (s *controller) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	release, err := s.d.ids.Acquire("volume", req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	v, err := s.d.backend.Volume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if err := contract.CheckMutableKind(v.ID, v.AccessType, v.FsType, req.GetMutableParameters()); err != nil {
		return nil, contract.ToStatus(err)
	}
	if err := s.d.backend.ModifyVolume(ctx, v.ID, req.GetMutableParameters()); err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
}
