package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func csiHealth(id string, h contract.Health) *csi.VolumeHealth {
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

// ControllerGetVolumeHealth reports one volume's problems (backend
// VolumeHealth); a healthy volume has no entries.
func (s *controller) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	h, err := s.d.backend.VolumeHealth(ctx, req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: csiHealth(req.GetVolumeId(), h)}, nil
}

// ControllerListVolumeHealth pages through the volumes' health like
// ListVolumes. Codes: INVALID_ARGUMENT, ABORTED (foreign token).
func (s *controller) ControllerListVolumeHealth(ctx context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	vols, next, err := s.volumePage(ctx, req.GetMaxEntries(), req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, v := range vols {
		h, err := s.d.backend.VolumeHealth(ctx, v.ID)
		if err != nil {
			continue // deleted meanwhile
		}
		resp.Entries = append(resp.Entries, csiHealth(v.ID, h))
	}
	return resp, nil
}
