package cluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Snapshot copies on the controller side: placing them, reporting where a
// snapshot is, deleting them with it (snapshot_copy.go has the node side).

// copiesOf is every copy object of snapshot id in the cache, copied out of
// it (removeSnapshot patches them).
func (b *ControllerBackend) copiesOf(id string) []*v1.LocalSnapshot {
	var out []*v1.LocalSnapshot
	for _, ls := range all[*v1.LocalSnapshot](b.cache.snapshots) {
		if ls.Spec.CopyOf == id {
			out = append(out, ls.DeepCopy())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Node < out[j].Spec.Node })
	return out
}

// copiesWanted is how many nodes should hold snapshot ls: its spec.copies,
// or for a member of a group snapshot the group's (the node plugin creates
// the members and never asks for copies itself).
func (b *ControllerBackend) copiesWanted(ls *v1.LocalSnapshot) int {
	if ls.Spec.Copies > 0 || ls.Spec.GroupSnapshot == "" {
		return int(ls.Spec.Copies)
	}
	if g, ok := get[*v1.LocalGroupSnapshot](b.cache.groups, ls.Spec.GroupSnapshot); ok {
		return int(g.Spec.Copies)
	}
	return 0
}

// holders are the nodes with a complete copy of ls: its own node first,
// then those of its Ready copies.
func (b *ControllerBackend) holders(ls *v1.LocalSnapshot) []string {
	nodes := []string{ls.Spec.Node}
	if b.copiesWanted(ls) < 2 {
		return nodes
	}
	for _, cp := range b.copiesOf(ls.Name) {
		if cp.Status.ReadyToUse && !cp.Deleting() {
			nodes = append(nodes, cp.Spec.Node)
		}
	}
	return nodes
}

// snapshotOf is toSnapshot with the nodes that hold it.
func (b *ControllerBackend) snapshotOf(ls *v1.LocalSnapshot) *contract.Snapshot {
	s := toSnapshot(ls)
	s.Nodes = b.holders(ls)
	return s
}

// ensureCopies creates the copy objects ls still lacks (spec.copies), each
// on the node with the most room among those that can take it: another
// node than any holding ls, serving the node-to-node channel, heard from,
// with room for the snapshot's size. A copy that failed for good is
// replaced on another node. Too few candidates: as many as there are, the
// rest at the next pass (keepCopies).
func (b *ControllerBackend) ensureCopies(ctx context.Context, ls *v1.LocalSnapshot) error {
	want := b.copiesWanted(ls) - 1
	if want < 1 || !ls.Status.ReadyToUse || ls.Deleting() {
		return nil
	}
	taken := []string{ls.Spec.Node}
	have := 0
	for _, cp := range b.copiesOf(ls.Name) {
		taken = append(taken, cp.Spec.Node)
		switch {
		case cp.Deleting():
		case cp.Status.Phase == v1.PhaseFailed:
			// Replace it: its node keeps it listed in taken, so the new
			// copy goes elsewhere; the failed one holds no data.
			if err := b.removeSnapshot(ctx, cp); err != nil {
				return err
			}
		default:
			have++
		}
	}
	if have >= want {
		return nil
	}
	var nodes []string
	for _, ln := range all[*v1.LocalNode](b.cache.nodes) {
		if !slices.Contains(taken, ln.Name) && b.transferable(ls.Spec.Node, ln.Name) == "" {
			nodes = append(nodes, ln.Name)
		}
	}
	if err := b.sortByRoom(ctx, nodes); err != nil {
		return err
	}
	size := ls.Status.SizeBytes.Value()
	for _, node := range nodes {
		if have >= want {
			break
		}
		r, err := b.room(ctx, node)
		if err != nil {
			return err
		}
		if r.reason != "" || r.available < size {
			continue
		}
		cp := &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: contract.SnapshotCopyName(ls.Name, node), Labels: map[string]string{v1.NodeLabel: node, v1.CopyOfLabel: ls.Name}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: ls.Spec.SourceVolume, Node: node, CSIName: ls.Spec.CSIName, CopyOf: ls.Name},
		}
		if err := b.c.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		klog.InfoS("Snapshot copy placed", "snapshotID", ls.Name, "node", node, "size", size)
		have++
	}
	if have < want {
		klog.InfoS("Not enough nodes for the snapshot's copies yet; trying again later", "snapshotID", ls.Name, "copies", want+1, "placed", have+1)
	}
	return nil
}

// keepCopies places missing copies every interval, for the snapshots whose
// copies could not all be placed when they were cut, or whose copy failed.
func (b *ControllerBackend) keepCopies(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ls := range all[*v1.LocalSnapshot](b.cache.snapshots) {
			if ls.Spec.CopyOf != "" || b.copiesWanted(ls) < 2 {
				continue
			}
			if err := b.ensureCopies(ctx, ls); err != nil {
				klog.ErrorS(err, "Cannot place the snapshot's copies yet", "snapshotID", ls.Name)
			}
		}
	}
}

// removeCopies records the delete intent on every copy of snapshot id.
func (b *ControllerBackend) removeCopies(ctx context.Context, id string) error {
	for _, cp := range b.copiesOf(id) {
		if err := b.removeSnapshot(ctx, cp); err != nil {
			return fmt.Errorf("delete the copy of snapshot %s on node %s: %w", id, cp.Spec.Node, err)
		}
	}
	return nil
}
