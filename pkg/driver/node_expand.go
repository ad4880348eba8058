package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// Volume expansion of the Node service (EXPAND_VOLUME: spec
// §NodeExpandVolume).

// NodeExpandVolume makes the node see a volume's new size (spec
// §NodeExpandVolume): a block volume's loop device is refreshed without
// detaching, a btrfs volume's qgroup limit re-applied. When capacity_range
// asks for more than the recorded size, all mode grows the volume here with
// ControllerExpandVolume's checks (this node's manager is the controller's
// backend); node mode answers OUT_OF_RANGE, as the controller owns sizes.
// Codes: INVALID_ARGUMENT (no id or path), NOT_FOUND (unknown volume or
// missing path), OUT_OF_RANGE (above --max-volume-size), RESOURCE_EXHAUSTED
// (no room), ABORTED.
func (s *node) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	capacity, err := s.d.pub.NodeExpand(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, toStatus(err)
	}
	if req.GetCapacityRange().GetRequiredBytes() > capacity {
		// Kubernetes always calls ControllerExpandVolume first; a CO that
		// asks the node directly gets the growth here, checked against this
		// node's capacity like any expansion. In node mode the LocalVolume's
		// status reports the larger capacity at its next reconcile, and the
		// controller counts max(spec.size, status.capacityBytes).
		size, err := resolveSize(req.GetCapacityRange(), s.d.opts.DefaultVolumeBytes, s.d.opts.MaxVolumeBytes)
		if err != nil {
			return nil, err
		}
		v, err := s.d.store.Resolve(req.GetVolumeId())
		if err != nil {
			return nil, toStatus(err)
		}
		if _, err = s.d.store.Expand(v.ID, size); err != nil {
			return nil, toStatus(err)
		}
		// The node side again: an image volume's loop device and filesystem
		// grow to the new size.
		if capacity, err = s.d.pub.NodeExpand(req.GetVolumeId(), req.GetVolumePath()); err != nil {
			return nil, toStatus(err)
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: capacity}, nil
}
