package driver

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// NodeGetVolumeHealth reports one volume's problems (Store.Health), and
// Inaccessible when volume_publish_path, if given, does not show it.
func (s *node) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	h, err := s.d.store.Health(req.GetVolumeId())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if p := req.GetVolumePublishPath(); p != "" {
		if _, err := s.d.pub.Stats(req.GetVolumeId(), p); errors.Is(err, contract.ErrNotFound) {
			h.Problems = append(h.Problems, contract.Problem{Kind: "Inaccessible", Reason: "NotPublished",
				Message: "the volume is not mounted at volume_publish_path " + p})
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: csiHealth(req.GetVolumeId(), h)}, nil
}

// NodeGetStorageHealth reports the data root: unreachable when it is not
// writable or its state file unreadable; healthy is an empty list.
func (s *node) NodeGetStorageHealth(ctx context.Context, req *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp := &csi.NodeGetStorageHealthResponse{}
	if err := s.d.store.Probe(); err != nil {
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "DataRootUnusable", Message: err.Error(),
		})
	}
	return resp, nil
}
