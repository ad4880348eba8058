package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// The volume group snapshot calls of ControllerBackend (driver.GroupBackend).
// A group is a LocalGroupSnapshot that the node holding all its volumes cuts
// at one point in time; that node then creates a LocalSnapshot per member,
// which restores, lists and deletes like any snapshot.

// memberSnapshotID is the snapshot_id of group gid's snapshot of volume
// volID: the same on every retry.
func memberSnapshotID(gid, volID string) string {
	return SnapshotIDFor("\x00group/" + gid + "/" + volID)
}

// CreateGroupSnapshot implements driver.GroupBackend: all volumes must be
// Ready on one node (FAILED_PRECONDITION otherwise); it records the
// LocalGroupSnapshot and waits until the node cut it and made its members,
// whose copies on other nodes it then places (ensureCopies), as
// CreateSnapshot does.
func (b *ControllerBackend) CreateGroupSnapshot(ctx context.Context, name string, sourceIDs []string, copies int) (*contract.GroupSnapshot, error) {
	gid := contract.GroupSnapshotIDFor(name)
	ids := slices.Sorted(slices.Values(sourceIDs))
	if len(slices.Compact(slices.Clone(ids))) != len(ids) {
		return nil, fmt.Errorf("%w: a source volume is named twice", contract.ErrInvalid)
	}
	g, ok, err := getOrRead(ctx, b.c, b.cache.groups, gid, &v1.LocalGroupSnapshot{})
	if err != nil {
		return nil, err
	}
	if ok {
		if !slices.Equal(g.Spec.Volumes, ids) {
			return nil, fmt.Errorf("%w: group snapshot %q exists of volumes %s", contract.ErrExists, name, strings.Join(g.Spec.Volumes, ", "))
		}
		return b.waitGroup(ctx, gid)
	}
	nodes := map[string][]string{}
	for _, id := range ids {
		lv, err := b.getVolume(ctx, id)
		if err != nil {
			return nil, err
		}
		if lv.Status.Phase != v1.PhaseReady || lv.Deleting() {
			return nil, fmt.Errorf("%w: volume %q is %s", contract.ErrNotFound, id, phaseOf(lv.Status.Phase))
		}
		nodes[lv.Spec.Node] = append(nodes[lv.Spec.Node], id)
	}
	if len(nodes) > 1 {
		var on []string
		for _, n := range slices.Sorted(maps.Keys(nodes)) {
			on = append(on, fmt.Sprintf("%s on node %s", strings.Join(nodes[n], ", "), n))
		}
		return nil, fmt.Errorf("%w: the volumes are on different nodes (%s); a group snapshot is cut on one node", contract.ErrPrecondition, strings.Join(on, "; "))
	}
	var node string
	for n := range nodes {
		node = n
	}
	g = &v1.LocalGroupSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: gid, Labels: map[string]string{v1.NodeLabel: node}},
		Spec:       v1.LocalGroupSnapshotSpec{Node: node, CSIName: name, Volumes: ids, Copies: int32(copies)},
	}
	for _, id := range ids {
		g.Spec.Snapshots = append(g.Spec.Snapshots, memberSnapshotID(gid, id))
	}
	if err := b.c.Create(ctx, g); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return b.waitGroup(ctx, gid)
}

// waitGroup waits until group gid is cut with its members ready, or fails; a
// Failed group is removed so that a retry starts afresh.
func (b *ControllerBackend) waitGroup(ctx context.Context, gid string) (*contract.GroupSnapshot, error) {
	g := &v1.LocalGroupSnapshot{}
	err := b.waitFor(ctx, "LocalGroupSnapshot", b.cache.groups, &v1.LocalGroupSnapshot{}, gid, true,
		func(o client.Object) (bool, error) {
			g = o.(*v1.LocalGroupSnapshot)
			if g.Status.ReadyToUse {
				return true, nil
			}
			if g.Status.Phase == v1.PhaseFailed {
				return true, failure(g.Status.ErrorCode, g.Status.Conditions, "group snapshot "+gid)
			}
			return false, nil
		})
	if err != nil {
		if g.Status.Phase == v1.PhaseFailed {
			if derr := b.c.Delete(ctx, g); client.IgnoreNotFound(derr) != nil {
				klog.ErrorS(derr, "Cannot remove a failed group snapshot", "groupSnapshotID", gid)
			}
		}
		return nil, err
	}
	out := &contract.GroupSnapshot{ID: gid}
	for _, id := range g.Spec.Snapshots {
		s, err := b.waitSnapshot(ctx, id, true)
		if err != nil {
			return nil, err
		}
		if ls, ok := get[*v1.LocalSnapshot](b.cache.snapshots, id); ok {
			if err := b.ensureCopies(ctx, ls); err != nil {
				return nil, err
			}
			s = b.snapshotOf(ls)
		}
		out.Snapshots = append(out.Snapshots, s)
	}
	if g.Status.CreationTime != nil {
		out.CreatedAt = g.Status.CreationTime.UTC()
	}
	return out, nil
}

// GroupSnapshot implements driver.GroupBackend: a group that is cut, with
// its members (ErrNotFound for one that is not, or not yet).
func (b *ControllerBackend) GroupSnapshot(ctx context.Context, id string, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	g, err := b.getGroup(ctx, id)
	if err != nil {
		return nil, err
	}
	if !g.Status.ReadyToUse || g.DeletionTimestamp != nil {
		return nil, fmt.Errorf("%w: group snapshot %q is %s", contract.ErrNotFound, id, phaseOf(g.Status.Phase))
	}
	if err := b.sameMembers(ctx, g, snapshotIDs); err != nil {
		return nil, err
	}
	out := &contract.GroupSnapshot{ID: id}
	if g.Status.CreationTime != nil {
		out.CreatedAt = g.Status.CreationTime.UTC()
	}
	for _, sid := range g.Spec.Snapshots {
		if ls, err := b.liveSnapshot(ctx, sid); err == nil {
			out.Snapshots = append(out.Snapshots, b.snapshotOf(ls))
		} else if !errors.Is(err, contract.ErrNotFound) {
			return nil, err
		}
	}
	return out, nil
}

// DeleteGroupSnapshot implements driver.GroupBackend: the members as by
// DeleteSnapshot, then the group; an unknown group succeeds.
func (b *ControllerBackend) DeleteGroupSnapshot(ctx context.Context, id string, snapshotIDs []string) error {
	g, err := b.getGroup(ctx, id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := b.sameMembers(ctx, g, snapshotIDs); err != nil {
		return err
	}
	for _, sid := range g.Spec.Snapshots {
		if err := b.DeleteSnapshot(ctx, sid); err != nil {
			return err
		}
	}
	if err := b.c.Delete(ctx, g); client.IgnoreNotFound(err) != nil {
		return err
	}
	klog.V(2).InfoS("Group snapshot deleted", "groupSnapshotID", id)
	// Read your writes: a GetVolumeGroupSnapshot right after answers from
	// the cache.
	ctx, cancel := b.waitCtx(ctx)
	defer cancel()
	return b.awaitCache(ctx, "LocalGroupSnapshot", b.cache.groups, id, func(o client.Object, ok bool) (bool, error) {
		return !ok || o.GetDeletionTimestamp() != nil, nil
	})
}

// getGroup is LocalGroupSnapshot id from the cache or the API server.
func (b *ControllerBackend) getGroup(ctx context.Context, id string) (*v1.LocalGroupSnapshot, error) {
	if !contract.ValidGroupSnapshotID(id) {
		return nil, fmt.Errorf("%w: group snapshot %q", contract.ErrNotFound, id)
	}
	g, ok, err := getOrRead(ctx, b.c, b.cache.groups, id, &v1.LocalGroupSnapshot{})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: group snapshot %q", contract.ErrNotFound, id)
	}
	return g, nil
}

// sameMembers checks the snapshot_ids a CO gave for group g
// (contract.CheckGroupMembers).
func (b *ControllerBackend) sameMembers(ctx context.Context, g *v1.LocalGroupSnapshot, snapshotIDs []string) error {
	return contract.CheckGroupMembers(g.Name, g.Spec.Snapshots, snapshotIDs, func(id string) bool {
		_, err := b.getSnapshot(ctx, id)
		return err == nil
	})
}
