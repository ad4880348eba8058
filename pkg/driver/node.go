package driver

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
)

// node is the CSI Node service: it validates requests and hands the work to
// the Publisher (pkg/publish).
type node struct {
	csi.UnimplementedNodeServer
	d *Driver
}

// ephemeralKey is the volume_context key kubelet sets for CSI ephemeral
// inline volumes.
const ephemeralKey = "csi.storage.k8s.io/ephemeral"

// checkVolumeCap judges capability c against volume id (judgeCaps):
// NOT_FOUND for an unknown volume, FAILED_PRECONDITION for the other access type.
func (s *node) checkVolumeCap(id string, c *csi.VolumeCapability) error {
	v, err := s.d.store.Get(id)
	if err != nil {
		return contract.ToStatus(err)
	}
	return checkNodeCap(c, v)
}

// checkNodePath validates a CO-given path before any lookup: an unusable path
// is INVALID_ARGUMENT whether or not the volume exists (csi-sanity sends
// unknown ids with bad paths).
func checkNodePath(field, p string) error { return contract.ToStatus(mount.CheckPath(field, p)) }

// checkPathPlace refuses (INVALID_ARGUMENT), before any lookup, a malformed
// path, one outside --kubelet-root, and one that could reach the driver's own
// data (mount.CheckOutside).
func (s *node) checkPathPlace(field, p string) error {
	if err := checkNodePath(field, p); err != nil {
		return err
	}
	if err := checkKubeletRoot(field, p, s.d.opts.KubeletRoot); err != nil {
		return err
	}
	return contract.ToStatus(mount.CheckOutside(s.d.store.Root(), field, p))
}

// checkKubeletRoot refuses p unless it lies strictly below root (both with
// the symlinks of their existing parts resolved, so a symlinked
// /var/lib/kubelet works and a symlink inside it cannot lead out; p's last
// component is judged as it is). An empty root disables the check.
func checkKubeletRoot(field, p, root string) error {
	if root == "" {
		return nil
	}
	rroot := mount.ResolveExisting(root)
	rp := filepath.Join(mount.ResolveExisting(filepath.Dir(filepath.Clean(p))), filepath.Base(p))
	if rp != rroot && strings.HasPrefix(rp, strings.TrimSuffix(rroot, "/")+"/") {
		return nil
	}
	resolved := ""
	if rp != filepath.Clean(p) {
		resolved = fmt.Sprintf(" (%q with symlinks resolved)", rp)
	}
	return invalid("%s %q%s is not below the kubelet root %q (--kubelet-root); the node plugin works only on paths the kubelet gives it there", field, p, resolved, root)
}

// NodeStageVolume: see publish.Publisher.Stage. The capability is judged by
// judgeCaps, as in CreateVolume.
func (s *node) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := checkNodeCap(req.GetVolumeCapability(), notLookedUp); err != nil {
		return nil, err
	}
	c := req.GetVolumeCapability()
	if err := s.checkVolumeCap(req.GetVolumeId(), c); err != nil {
		return nil, err
	}
	err := s.d.pub.Stage(req.GetVolumeId(), req.GetStagingTargetPath(), accessTypeOf([]*csi.VolumeCapability{c}), c.GetMount().GetMountFlags(), req.GetSecrets())
	return &csi.NodeStageVolumeResponse{}, contract.ToStatus(err)
}

// NodeUnstageVolume: see publish.Publisher.Unstage.
func (s *node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, contract.ToStatus(s.d.pub.Unstage(ctx, req.GetVolumeId(), req.GetStagingTargetPath()))
}

// podUIDKey is the volume_context key of the pod a NodePublishVolume is
// for (the kubelet sends it when the CSIDriver has podInfoOnMount).
const podUIDKey = "csi.storage.k8s.io/pod.uid"

// podUIDPattern is a Kubernetes UID: a UUID, or a static pod's hash.
var podUIDPattern = regexp.MustCompile(`^[0-9a-zA-Z][-0-9a-zA-Z_]{0,63}$`)

// NodePublishVolume: see publish.Publisher.Publish (ephemeral inline volumes:
// publishEphemeral). It adds that target_path and staging_target_path must be
// apart (INVALID_ARGUMENT).
func (s *node) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := checkNodeCap(req.GetVolumeCapability(), notLookedUp); err != nil {
		return nil, err
	}
	if req.GetVolumeContext()[ephemeralKey] == "true" {
		return s.publishEphemeral(ctx, req)
	}
	if req.GetStagingTargetPath() == "" {
		return nil, invalid("staging_target_path is required: the driver advertises STAGE_UNSTAGE_VOLUME")
	}
	if err := s.checkPathPlace("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if t, st := req.GetTargetPath(), req.GetStagingTargetPath(); t == st || strings.HasPrefix(t, st+"/") || strings.HasPrefix(st, t+"/") {
		return nil, invalid("target_path %q and staging_target_path %q must be apart: neither may be or hold the other", t, st)
	}
	c := req.GetVolumeCapability()
	if err := s.checkVolumeCap(req.GetVolumeId(), c); err != nil {
		return nil, err
	}
	uid := req.GetVolumeContext()[podUIDKey]
	if uid != "" && !podUIDPattern.MatchString(uid) {
		return nil, invalid("volume_context %s=%q is not a pod UID", podUIDKey, uid)
	}
	err := s.d.pub.Publish(req.GetVolumeId(), contract.PublishOptions{
		StagingPath:  req.GetStagingTargetPath(),
		TargetPath:   req.GetTargetPath(),
		AccessType:   accessTypeOf([]*csi.VolumeCapability{c}),
		ReadOnly:     readOnly(req),
		SingleWriter: c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		MountFlags:   c.GetMount().GetMountFlags(),
		PodUID:       uid,
	})
	return &csi.NodePublishVolumeResponse{}, contract.ToStatus(err)
}

// readOnly is whether a publish is read-only: readonly, or an access mode
// that allows reading only (SINGLE_NODE_READER_ONLY, CSI spec AccessMode:
// a volume published read-write under it could be written).
func readOnly(req *csi.NodePublishVolumeRequest) bool {
	return req.GetReadonly() || req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}

// NodeUnpublishVolume: see publish.Publisher.Unpublish.
func (s *node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := s.d.pub.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats: see publish.Publisher.Stats.
func (s *node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	u, err := s.d.pub.Stats(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	resp := &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: u.TotalBytes, Used: u.UsedBytes, Available: u.AvailableBytes},
	}}
	if u.HasInodes {
		resp.Usage = append(resp.Usage, &csi.VolumeUsage{Unit: csi.VolumeUsage_INODES, Total: u.TotalInodes, Used: u.UsedInodes, Available: u.FreeInodes})
	}
	return resp, nil
}

// NodeGetInfo returns the node id, its topology segment and the volume limit.
func (s *node) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             s.d.opts.NodeID,
		MaxVolumesPerNode:  s.d.opts.MaxVolumesPerNode,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{TopologyKey: s.d.opts.NodeID}},
	}, nil
}

// NodeGetCapabilities advertises staging, volume stats, expansion, health and
// SINGLE_NODE_MULTI_WRITER.
func (s *node) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}
