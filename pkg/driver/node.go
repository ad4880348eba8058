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

// node is the CSI Node service (spec §Node Service RPC). It validates the
// request and hands the work to the Publisher (pkg/publish), which takes
// the per-volume lock (a concurrent call on the same volume: ABORTED),
// decides what to mount and has its mount.Interface do it.
type node struct {
	csi.UnimplementedNodeServer
	d *Driver
}

// ephemeralKey is the volume_context key kubelet sets for CSI ephemeral
// inline volumes.
const ephemeralKey = "csi.storage.k8s.io/ephemeral"

// checkVolumeCap judges capability c against the volume id names
// (judgeCaps with its access type): NOT_FOUND for an unknown volume,
// FAILED_PRECONDITION for the other access type.
func (s *node) checkVolumeCap(id string, c *csi.VolumeCapability) error {
	v, err := s.d.store.Get(id)
	if err != nil {
		return toStatus(err)
	}
	return checkNodeCap(c, v)
}

// checkNodePath validates a staging_target_path or target_path given by the
// CO, before any lookup (mount.CheckPath): an unusable path is
// INVALID_ARGUMENT whether or not the volume exists (spec error scheme;
// csi-sanity sends unknown ids with bad paths).
func checkNodePath(field, p string) error { return toStatus(mount.CheckPath(field, p)) }

// checkPathPlace refuses, before any lookup, a staging or target path the
// node must not work on: malformed (checkNodePath), outside --kubelet-root
// when one is set, and anywhere it could reach the driver's own data (the
// data root, inside it, above it, or inside a volume's mount).
// INVALID_ARGUMENT naming the path.
func (s *node) checkPathPlace(field, p string) error {
	if err := checkNodePath(field, p); err != nil {
		return err
	}
	if err := checkKubeletRoot(field, p, s.d.opts.KubeletRoot); err != nil {
		return err
	}
	return toStatus(mount.CheckOutside(s.d.store.Root(), field, p))
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

// NodeStageVolume bind-mounts a mount volume onto staging_target_path, or
// attaches a block volume's loop device and makes a device node of it at
// <staging_target_path>/<volume_id> (spec §NodeStageVolume). The capability
// is judged by judgeCaps, as in CreateVolume and
// ValidateVolumeCapabilities. Codes: INVALID_ARGUMENT (missing field,
// malformed capability, a mount flag a bind mount cannot apply, path not a
// directory or a symlink), NOT_FOUND (unknown volume), FAILED_PRECONDITION
// (a multi-node access mode, or the other access type), ALREADY_EXISTS
// (staged with other flags or something else mounted there), ABORTED (call
// on this id in flight).
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
	err := s.d.pub.Stage(req.GetVolumeId(), req.GetStagingTargetPath(), accessTypeOf([]*csi.VolumeCapability{c}), c.GetMount().GetMountFlags())
	return &csi.NodeStageVolumeResponse{}, toStatus(err)
}

// NodeUnstageVolume undoes NodeStageVolume at staging_target_path (spec
// §NodeUnstageVolume): the mount there is removed; for a block volume the
// device node <staging_target_path>/<volume_id> too, and its loop devices,
// read-write and read-only, are detached; an image volume's loop device is
// detached once its filesystem is mounted nowhere. Not staged at this
// path, and unknown volumes, are success and change nothing: a wrong
// staging path never detaches a loop device that a stage or publication
// elsewhere uses. Another call on the volume is waited for until the
// request's deadline. Codes: INVALID_ARGUMENT, FAILED_PRECONDITION (an
// image or block volume staged here is still published), ABORTED (still
// busy at the deadline).
func (s *node) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, toStatus(s.d.pub.Unstage(ctx, req.GetVolumeId(), req.GetStagingTargetPath()))
}

// podUIDKey is the volume_context key of the pod a NodePublishVolume is
// for (the kubelet sends it when the CSIDriver has podInfoOnMount).
const podUIDKey = "csi.storage.k8s.io/pod.uid"

// podUIDPattern is a Kubernetes UID: a UUID, or a static pod's hash.
var podUIDPattern = regexp.MustCompile(`^[0-9a-zA-Z][-0-9a-zA-Z_]{0,63}$`)

// NodePublishVolume bind-mounts the staged volume onto target_path,
// read-only when asked, with the capability's mount flags (spec
// §NodePublishVolume). A block volume's device node is bound onto a file at
// target_path: the read-write loop device, or with readonly a read-only
// loop device over the same image, which refuses writes (EPERM). A
// repeated call must ask for what is there: the same volume, readonly and
// flags, for both access types. Codes: INVALID_ARGUMENT (as for
// NodeStageVolume), NOT_FOUND, FAILED_PRECONDITION (not staged; a
// multi-node access mode or the other access type), ALREADY_EXISTS (target
// holds another mount, or this volume with another readonly or other
// flags), ABORTED. INVALID_ARGUMENT too when target_path and
// staging_target_path are the same path or one holds the other. A
// SINGLE_NODE_READER_ONLY capability publishes read-only, as readonly does.
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
	return &csi.NodePublishVolumeResponse{}, toStatus(err)
}

// readOnly is whether a publish is read-only: readonly, or an access mode
// that allows reading only (SINGLE_NODE_READER_ONLY, CSI spec AccessMode:
// a volume published read-write under it could be written).
func readOnly(req *csi.NodePublishVolumeRequest) bool {
	return req.GetReadonly() || req.GetVolumeCapability().GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}

// NodeUnpublishVolume unmounts and removes target_path (spec
// §NodeUnpublishVolume). It succeeds for unknown volumes and paths that are
// missing or not mounted, so kubelet can always finish. Codes:
// INVALID_ARGUMENT, FAILED_PRECONDITION (left in place after the unmount: a
// non-empty directory, a file with data, a FIFO, socket or device node —
// only what a publish makes, a directory or an empty file, is removed). An
// ephemeral inline volume is deleted with its publication; a
// block volume's read-only loop device is detached with its last read-only
// publication.
func (s *node) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if err := s.checkPathPlace("target_path", req.GetTargetPath()); err != nil {
		return nil, err
	}
	// The manager waits for a concurrent call on the same id (bounded by
	// ctx) instead of answering ABORTED: unpublish is short and idempotent,
	// and kubelet must be able to finish it (a pod stays Terminating until
	// it does).
	if err := s.d.pub.Unpublish(ctx, req.GetVolumeId(), req.GetTargetPath()); err != nil {
		return nil, toStatus(err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// NodeGetVolumeStats reports the volume's own usage in bytes and inodes
// (not its host filesystem's) (spec §NodeGetVolumeStats). volume_path must
// be where the volume is staged or published, as NodeStageVolume and
// NodePublishVolume made it (for a block volume: the bind-mounted device
// file at a target_path, or a staging directory holding its staged device
// node); any other path is NOT_FOUND, even while the volume is attached.
// Codes: INVALID_ARGUMENT, NOT_FOUND (unknown volume, or volume_path does
// not show it). Takes no lock: it only reads.
func (s *node) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, invalid("volume_id is required")
	}
	if req.GetVolumePath() == "" {
		return nil, invalid("volume_path is required")
	}
	u, err := s.d.pub.Stats(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, toStatus(err)
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
