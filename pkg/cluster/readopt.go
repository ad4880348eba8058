package cluster

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// nodeData finds one node's data that no object claims (orphans) and
// re-creates objects for it (re-adoption).
type nodeData struct {
	c     client.Client
	node  string
	vm    NodeStore
	snaps NodeSnapshots
}

// readoptGone re-adopts at once the data of an object just deleted without a
// delete intent, instead of at the next heartbeat (after a DeleteVolume the
// data is already gone).
func (d nodeData) readoptGone(ctx context.Context, kind, id string) error {
	var path string
	switch {
	case kind == "Volume" && contract.ValidVolumeID(id):
		v, err := d.vm.Get(id)
		if err != nil || v.Ephemeral {
			return nil
		}
		path = d.vm.DataPath(v)
	case kind == "Snapshot" && contract.ValidSnapshotID(id):
		s, err := d.snaps.Get(id)
		if err != nil || s.Copy {
			// A copy belongs to its copy object, which still claims it
			// when the snapshot's own object goes first (orphans).
			return nil
		}
		path = d.snaps.Path(s)
	default:
		return nil
	}
	klog.InfoS("Object deleted without a delete request; keeping its data", "kind", kind, "id", id, "path", path)
	d.readopt(ctx, []v1.OrphanedData{{ID: id, Kind: kind, Path: path}})
	return nil
}

// readopt re-creates objects (with ReadoptedLabel) for data this node holds
// that no object claims, its object gone by hand or with its CRD, so existing
// PVs work again with no manual step. It returns what it could not re-adopt.
func (d nodeData) readopt(ctx context.Context, orphans []v1.OrphanedData) []v1.OrphanedData {
	var left []v1.OrphanedData
	for _, o := range orphans {
		var obj client.Object
		labels := map[string]string{v1.NodeLabel: d.node, v1.ReadoptedLabel: "true"}
		switch o.Kind {
		case "Volume":
			v, err := d.vm.Get(o.ID)
			if err != nil {
				continue
			}
			lv := &v1.LocalVolume{
				ObjectMeta: metav1.ObjectMeta{Name: v.ID, Labels: labels},
				Spec: v1.LocalVolumeSpec{
					Node: d.node, Size: quantity(v.CapacityBytes), VolumeMode: volumeMode(v.AccessType),
					FsType: v.FsType, Engine: string(v.Engine), Parameters: v.Parameters, MutableParameters: v.MutableParameters, CSIName: v.Name,
				},
			}
			if v.SourceSnapshotID != "" || v.SourceVolumeID != "" {
				lv.Spec.ContentSource = &v1.ContentSource{Snapshot: v.SourceSnapshotID, Volume: v.SourceVolumeID}
			}
			obj = lv
		case "Snapshot":
			s, err := d.snaps.Get(o.ID)
			if err != nil {
				continue
			}
			ls := &v1.LocalSnapshot{
				ObjectMeta: metav1.ObjectMeta{Name: s.ID, Labels: labels},
				Spec:       v1.LocalSnapshotSpec{SourceVolume: s.SourceVolumeID, Node: d.node, CSIName: s.Name, GroupSnapshot: s.GroupSnapshotID},
			}
			if s.GroupSnapshotID != "" {
				ls.Spec.CSIName = "" // a member's record name is not a CSI name
			}
			obj = ls
		}
		err := d.c.Create(ctx, obj)
		if err != nil && !apierrors.IsAlreadyExists(err) {
			klog.ErrorS(err, "Orphaned data: cannot re-create its object yet; the data is kept", "kind", o.Kind, "id", o.ID, "path", o.Path)
			left = append(left, o)
			continue
		}
		klog.InfoS("Re-adopted orphaned data: re-created its object", "kind", o.Kind, "id", o.ID, "path", o.Path)
	}
	return left
}

// orphans lists local volumes and snapshots that no object claims.
func (d nodeData) orphans(ctx context.Context) ([]v1.OrphanedData, error) {
	lvs := &v1.LocalVolumeList{}
	if err := d.c.List(ctx, lvs); err != nil {
		return nil, err
	}
	lss := &v1.LocalSnapshotList{}
	if err := d.c.List(ctx, lss); err != nil {
		return nil, err
	}
	claimed := map[string]bool{}
	for _, o := range lvs.Items {
		claimed[o.Name] = true
		if o.Spec.MoveOf != "" && o.Spec.Node == d.node {
			claimed[o.Spec.MoveOf] = true
		}
	}
	for _, o := range lss.Items {
		claimed[o.Name] = true
		if o.Spec.CopyOf != "" && o.Spec.Node == d.node {
			claimed[o.Spec.CopyOf] = true
		}
	}
	var out []v1.OrphanedData
	vols, _, err := d.vm.List("", 0)
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if !claimed[v.ID] && !v.Ephemeral {
			out = append(out, v1.OrphanedData{ID: v.ID, Kind: "Volume", Path: d.vm.DataPath(v), SizeBytes: quantity(v.CapacityBytes)})
		}
	}
	snaps, _, err := d.snaps.List("", 0, "")
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		if !claimed[s.ID] {
			out = append(out, v1.OrphanedData{ID: s.ID, Kind: "Snapshot", Path: d.snaps.Path(s), SizeBytes: quantity(s.SizeBytes)})
		}
	}
	return out, nil
}
