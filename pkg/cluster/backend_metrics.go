package cluster

import (
	"context"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// MetricSamples reports, for localdir_* gauges in controller mode, each
// node's capacity figures from its LocalNode and the objects by phase.
func (b *ControllerBackend) MetricSamples(ctx context.Context) []metrics.Sample {
	var out []metrics.Sample
	nodes := &v1.LocalNodeList{}
	if err := b.c.List(ctx, nodes); err == nil {
		for _, n := range nodes.Items {
			out = append(out,
				metrics.Sample{Desc: metrics.CapacityDesc, Value: float64(n.Status.CapacityBytes.Value()), Labels: []string{n.Name}},
				metrics.Sample{Desc: metrics.FreeDesc, Value: float64(n.Status.FreeBytes.Value()), Labels: []string{n.Name}},
				metrics.Sample{Desc: metrics.OrphansDesc, Value: float64(len(n.Status.Orphans)), Labels: []string{n.Name}})
			if r, err := b.room(ctx, n.Name); err == nil {
				out = append(out, metrics.Sample{Desc: metrics.AllocatableDesc, Value: float64(r.available), Labels: []string{n.Name}})
			}
		}
	}
	type key struct{ node, phase string }
	vols, snaps := map[key]int{}, map[key]int{}
	lvs := &v1.LocalVolumeList{}
	if err := b.c.List(ctx, lvs); err == nil {
		for _, lv := range lvs.Items {
			vols[key{lv.Spec.Node, phaseOf(lv.Status.Phase)}]++
		}
	}
	lss := &v1.LocalSnapshotList{}
	if err := b.c.List(ctx, lss); err == nil {
		for _, ls := range lss.Items {
			snaps[key{ls.Spec.Node, phaseOf(ls.Status.Phase)}]++
		}
	}
	for k, n := range vols {
		out = append(out, metrics.Sample{Desc: metrics.VolumesDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	for k, n := range snaps {
		out = append(out, metrics.Sample{Desc: metrics.SnapshotsDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	return out
}
