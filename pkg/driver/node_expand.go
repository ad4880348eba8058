package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// NodeExpandVolume: see publish.Publisher.NodeExpand. A capacity_range above
// the recorded size grows the volume here first.
func (s *node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	capacity, err := s.d.pub.NodeExpand(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	if req.GetCapacityRange().GetRequiredBytes() > capacity {
		// Kubernetes calls ControllerExpandVolume first; a CO that asks the node
		// directly gets the growth here, checked like any expansion. In node mode
		// the LocalVolume's status reports it at the next reconcile, and the
		// controller counts max(spec.size, status.capacityBytes).
		size, err := resolveSize(req.GetCapacityRange(), s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes)
		if err != nil {
			return nil, err
		}
		v, err := s.d.store.Resolve(req.GetVolumeId())
		if err != nil {
			return nil, contract.ToStatus(err)
		}
		if v.Image() {
			if size, err = alignBlocks(size, req.GetCapacityRange()); err != nil {
				return nil, err
			}
		}
		if _, err = s.d.store.Expand(v.ID, size); err != nil {
			return nil, contract.ToStatus(err)
		}
		// The node side again, for the new size.
		if capacity, err = s.d.pub.NodeExpand(req.GetVolumeId(), req.GetVolumePath()); err != nil {
			return nil, contract.ToStatus(err)
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}
