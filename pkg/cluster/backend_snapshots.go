package cluster

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// The snapshot calls of ControllerBackend.

// getSnapshot is LocalSnapshot id from the cache, or from the API server
// when the cache has none (getOrRead): for ids the CO gave.
func (b *ControllerBackend) getSnapshot(ctx context.Context, id string) (*v1.LocalSnapshot, error) {
	if !contract.ValidSnapshotID(id) {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	ls, ok, err := getOrRead(ctx, b.c, b.cache.snapshots, id, &v1.LocalSnapshot{})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	return ls, nil
}

// liveSnapshot is liveVolume for snapshots.
func (b *ControllerBackend) liveSnapshot(ctx context.Context, id string) (*v1.LocalSnapshot, error) {
	ls, err := b.getSnapshot(ctx, id)
	if err == nil && ls.Deleting() {
		return nil, fmt.Errorf("%w: snapshot %q is being deleted", contract.ErrNotFound, id)
	}
	return ls, err
}

// cachedSnapshot is the object cache's LocalSnapshot id (ErrNotFound when
// it has none): for the names CreateSnapshot checks, new ones mostly.
func (b *ControllerBackend) cachedSnapshot(id string) (*v1.LocalSnapshot, error) {
	if !contract.ValidSnapshotID(id) {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	ls, ok := get[*v1.LocalSnapshot](b.cache.snapshots, id)
	if !ok {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	return ls, nil
}

// SnapshotByName implements driver.Backend (Ready snapshots only).
func (b *ControllerBackend) SnapshotByName(ctx context.Context, name string) (*contract.Snapshot, error) {
	ls, err := b.cachedSnapshot(SnapshotIDFor(name))
	if errors.Is(err, contract.ErrNotFound) {
		return nil, nil
	}
	if err != nil || !ls.Status.ReadyToUse || ls.Deleting() {
		return nil, err
	}
	return b.snapshotOf(ls), nil
}

// Snapshot implements driver.Backend.
func (b *ControllerBackend) Snapshot(ctx context.Context, id string) (*contract.Snapshot, error) {
	ls, err := b.getSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ls.Status.ReadyToUse || ls.Deleting() {
		return nil, fmt.Errorf("%w: snapshot %q is not ready", contract.ErrNotFound, id)
	}
	return b.snapshotOf(ls), nil
}

// ListSnapshots implements driver.Backend.
func (b *ControllerBackend) ListSnapshots(ctx context.Context, after string, limit int, src string) ([]*contract.Snapshot, string, error) {
	items := all[*v1.LocalSnapshot](b.cache.snapshots)
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	var out []*contract.Snapshot
	for _, ls := range items {
		if ls.Name <= after || ls.Spec.CopyOf != "" || !ls.Status.ReadyToUse || ls.Deleting() || (src != "" && ls.Spec.SourceVolume != src) {
			continue
		}
		if limit > 0 && len(out) == limit {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, b.snapshotOf(ls))
	}
	return out, "", nil
}

// CreateSnapshot implements driver.Backend: a LocalSnapshot on the source's
// node, then a wait for readyToUse; with copies > 1, once it is ready, the
// copies on other nodes are placed (ensureCopies), not waited for.
func (b *ControllerBackend) CreateSnapshot(ctx context.Context, name, src string, topology *csi.TopologyRequirement, copies int) (*contract.Snapshot, error) {
	id := SnapshotIDFor(name)
	ls, err := b.cachedSnapshot(id)
	switch {
	case err == nil:
		if ls.Spec.SourceVolume != src {
			return nil, fmt.Errorf("%w: snapshot %q exists for volume %s", contract.ErrExists, name, ls.Spec.SourceVolume)
		}
		if ls.Deleting() {
			return nil, fmt.Errorf("%w: snapshot %s of the same name is still being deleted; retry later", contract.ErrBusy, id)
		}
	case errors.Is(err, contract.ErrNotFound):
		if err := b.recordSnapshot(ctx, id, name, src, topology, copies); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	snap, err := b.waitSnapshot(ctx, id, true)
	if err != nil {
		return nil, err
	}
	if ls, ok := get[*v1.LocalSnapshot](b.cache.snapshots, id); ok {
		if err := b.ensureCopies(ctx, ls); err != nil {
			return nil, err
		}
		snap = b.snapshotOf(ls)
	}
	return snap, nil
}

// recordSnapshot creates the LocalSnapshot id of volume src, on its node.
func (b *ControllerBackend) recordSnapshot(ctx context.Context, id, name, src string, topology *csi.TopologyRequirement, copies int) error {
	lv, err := b.Volume(ctx, src)
	if err != nil {
		return err
	}
	if !contract.Reachable(topology, lv.Node) {
		return fmt.Errorf("%w: the source volume lives on node %q, which the accessibility requirements exclude", contract.ErrNoSpace, lv.Node)
	}
	ls := &v1.LocalSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: lv.Node}},
		Spec:       v1.LocalSnapshotSpec{SourceVolume: src, Node: lv.Node, CSIName: name, Copies: int32(copies)},
	}
	b.deleted.Remove(id)
	if err := b.c.Create(ctx, ls); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

func (b *ControllerBackend) removeSnapshot(ctx context.Context, ls *v1.LocalSnapshot) error {
	return b.deleteWithIntent(ctx, ls, &ls.Spec.DeleteData)
}

// DeleteSnapshot implements driver.Backend like DeleteVolume.
func (b *ControllerBackend) DeleteSnapshot(ctx context.Context, id string) error {
	if deletedAndGone[*v1.LocalSnapshot](b, b.cache.snapshots, id) {
		return nil // deleted here, and gone since
	}
	ls, err := b.getSnapshot(ctx, id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := b.removeCopies(ctx, id); err != nil {
		return err
	}
	return b.removeSnapshot(ctx, ls)
}
