package driver

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// GroupBackend is a Backend that also takes volume group snapshots (the
// GroupController service is served only on one). Errors wrap the
// contract sentinels.
type GroupBackend interface {
	// CreateGroupSnapshot cuts one snapshot of each source volume at one
	// point in time for the CSI name (Snapshots.CreateGroup), each kept on
	// copies-1 other nodes too (copies <= 1: its node only).
	CreateGroupSnapshot(ctx context.Context, name string, sourceVolumeIDs []string, copies int) (*contract.GroupSnapshot, error)
	// GroupSnapshot returns a group (ErrNotFound); snapshotIDs, when given,
	// must be its members (ErrInvalid).
	GroupSnapshot(ctx context.Context, id string, snapshotIDs []string) (*contract.GroupSnapshot, error)
	// DeleteGroupSnapshot deletes a group's snapshots; unknown ids succeed.
	DeleteGroupSnapshot(ctx context.Context, id string, snapshotIDs []string) error
}

// CreateGroupSnapshot implements GroupBackend.
func (b *LocalBackend) CreateGroupSnapshot(_ context.Context, name string, ids []string, copies int) (*contract.GroupSnapshot, error) {
	if copies > 1 {
		return nil, fmt.Errorf("%w: the group snapshot parameter copies needs cluster mode: all mode has one node", contract.ErrInvalid)
	}
	return b.g(b.Snapshots.CreateGroup(name, ids))
}

// GroupSnapshot implements GroupBackend.
func (b *LocalBackend) GroupSnapshot(_ context.Context, id string, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	return b.g(b.Snapshots.GetGroup(id, snapshotIDs))
}

// DeleteGroupSnapshot implements GroupBackend.
func (b *LocalBackend) DeleteGroupSnapshot(_ context.Context, id string, snapshotIDs []string) error {
	return b.Snapshots.DeleteGroup(id, snapshotIDs)
}

func (b *LocalBackend) g(g *contract.GroupSnapshot, err error) (*contract.GroupSnapshot, error) {
	if g != nil {
		for _, s := range g.Snapshots {
			s.Node = b.NodeID
		}
	}
	return g, err
}

// groupController serves the CSI GroupController service (spec "Group
// Controller Service RPC"): CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT.
type groupController struct {
	csi.UnimplementedGroupControllerServer
	d *Driver
	b GroupBackend
}

// groupBackend is the driver's backend when it takes group snapshots.
func (d *Driver) groupBackend() (GroupBackend, bool) {
	if d.opts.Mode == ModeNode {
		return nil, false
	}
	g, ok := d.backend.(GroupBackend)
	return g, ok
}

// GroupControllerGetCapabilities advertises
// CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT.
func (s *groupController) GroupControllerGetCapabilities(context.Context, *csi.GroupControllerGetCapabilitiesRequest) (*csi.GroupControllerGetCapabilitiesResponse, error) {
	return &csi.GroupControllerGetCapabilitiesResponse{Capabilities: []*csi.GroupControllerServiceCapability{{
		Type: &csi.GroupControllerServiceCapability_Rpc{Rpc: &csi.GroupControllerServiceCapability_RPC{
			Type: csi.GroupControllerServiceCapability_RPC_CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT}},
	}}}, nil
}

// groupNameKey keeps group snapshot names apart from volume and snapshot
// names in the shared name lock set.
func groupNameKey(name string) string { return "group/" + name }

// groupDeletionPolicyKey is a group snapshot parameter accepted and ignored:
// the Kubernetes e2e storage suite copies its VolumeGroupSnapshotClass's
// deletionPolicy into the parameters, and classes copied from it carry it.
const groupDeletionPolicyKey = "deletionPolicy"

// GroupSnapshotCopies parses a VolumeGroupSnapshotClass's parameters: copies
// as for a VolumeSnapshotClass (SnapshotCopies), and deletionPolicy.
func GroupSnapshotCopies(params map[string]string) (int, error) {
	rest := map[string]string{}
	for k, v := range userParams(params) {
		switch {
		case k == SnapshotCopiesParam:
			rest[k] = v
		case k == groupDeletionPolicyKey && (v == "Delete" || v == "Retain"):
		default:
			return 0, invalid("unknown group snapshot parameter %q=%q (the driver takes %s, the %s* ones, and %s Delete or Retain, which changes nothing); remove it from the VolumeGroupSnapshotClass", k, v, SnapshotCopiesParam, reservedPrefix, groupDeletionPolicyKey)
		}
	}
	return SnapshotCopies(rest)
}

// CreateVolumeGroupSnapshot validates the request, locks the name and the
// source volumes and has the backend cut the group (see
// volume.Snapshots.CreateGroup). A repeated call with the same name and
// volumes returns the same group.
func (s *groupController) CreateVolumeGroupSnapshot(ctx context.Context, req *csi.CreateVolumeGroupSnapshotRequest) (*csi.CreateVolumeGroupSnapshotResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if len(req.GetSourceVolumeIds()) == 0 {
		return nil, invalid("source_volume_ids is required")
	}
	copies, err := GroupSnapshotCopies(req.GetParameters())
	if err != nil {
		return nil, err
	}
	for _, id := range req.GetSourceVolumeIds() {
		if !contract.ValidVolumeID(id) {
			return nil, status.Errorf(codes.NotFound, "source volume %q not found", id)
		}
	}
	release, err := s.d.names.Acquire("group snapshot name", groupNameKey(req.GetName()))
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	releaseSrc, err := s.d.ids.Acquire("volume", req.GetSourceVolumeIds()...)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer releaseSrc()
	g, err := s.b.CreateGroupSnapshot(ctx, req.GetName(), req.GetSourceVolumeIds(), copies)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.CreateVolumeGroupSnapshotResponse{GroupSnapshot: s.csiGroup(g, false)}, nil
}

// GetVolumeGroupSnapshot returns a group snapshot; snapshot_ids, when given,
// must be its members.
func (s *groupController) GetVolumeGroupSnapshot(ctx context.Context, req *csi.GetVolumeGroupSnapshotRequest) (*csi.GetVolumeGroupSnapshotResponse, error) {
	if req.GetGroupSnapshotId() == "" {
		return nil, invalid("group_snapshot_id is required")
	}
	g, err := s.b.GroupSnapshot(ctx, req.GetGroupSnapshotId(), req.GetSnapshotIds())
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.GetVolumeGroupSnapshotResponse{GroupSnapshot: s.csiGroup(g, true)}, nil
}

// DeleteVolumeGroupSnapshot deletes a group's snapshots; unknown ids succeed.
func (s *groupController) DeleteVolumeGroupSnapshot(ctx context.Context, req *csi.DeleteVolumeGroupSnapshotRequest) (*csi.DeleteVolumeGroupSnapshotResponse, error) {
	id := req.GetGroupSnapshotId()
	if id == "" {
		return nil, invalid("group_snapshot_id is required")
	}
	release, err := s.d.ids.Acquire("group snapshot", id)
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	defer release()
	if err := s.b.DeleteGroupSnapshot(ctx, id, req.GetSnapshotIds()); err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.DeleteVolumeGroupSnapshotResponse{}, nil
}

// csiGroup converts a group; its members as csiSnapshot converts them, with
// the nodes holding each when topology is set (GetVolumeGroupSnapshot).
func (s *groupController) csiGroup(g *contract.GroupSnapshot, topology bool) *csi.VolumeGroupSnapshot {
	c := &controller{d: s.d}
	out := &csi.VolumeGroupSnapshot{GroupSnapshotId: g.ID, CreationTime: timestamppb.New(g.CreatedAt), ReadyToUse: true}
	for _, snap := range g.Snapshots {
		out.Snapshots = append(out.Snapshots, c.csiSnapshot(snap, topology))
	}
	return out
}
