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
	for _, n := range all[*v1.LocalNode](b.cache.nodes) {
		out = append(out,
			metrics.Sample{Desc: metrics.CapacityDesc, Value: float64(n.Status.CapacityBytes.Value()), Labels: []string{n.Name}},
			metrics.Sample{Desc: metrics.FreeDesc, Value: float64(n.Status.FreeBytes.Value()), Labels: []string{n.Name}},
			metrics.Sample{Desc: metrics.OrphansDesc, Value: float64(len(n.Status.Orphans)), Labels: []string{n.Name}})
		if r, err := b.room(ctx, n.Name); err == nil {
			out = append(out, metrics.Sample{Desc: metrics.AllocatableDesc, Value: float64(r.available), Labels: []string{n.Name}})
		}
	}
	type key struct{ node, phase string }
	vols, snaps := map[key]int{}, map[key]int{}
	// A pending delete counts as Deleting whatever phase its node last
	// reported (its node plugin may be down).
	phase := func(p string, deleting bool) string {
		if deleting {
			return v1.PhaseDeleting
		}
		return phaseOf(p)
	}
	for _, lv := range all[*v1.LocalVolume](b.cache.volumes) {
		vols[key{lv.Spec.Node, phase(lv.Status.Phase, lv.Deleting())}]++
	}
	for _, ls := range all[*v1.LocalSnapshot](b.cache.snapshots) {
		snaps[key{ls.Spec.Node, phase(ls.Status.Phase, ls.Deleting())}]++
	}
	for k, n := range vols {
		out = append(out, metrics.Sample{Desc: metrics.VolumesDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	for k, n := range snaps {
		out = append(out, metrics.Sample{Desc: metrics.SnapshotsDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	return out
}
