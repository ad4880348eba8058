package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// In-place moves, on the nodes: a LocalVolume with spec.moveOf asks its
// node to pull volume moveOf from the node that holds it
// (spec.contentSource.node) and keep it under the same volume_id, while the
// volume's own LocalVolume stays on its node until the controller's mover
// (mover.go) has switched the PV over and removed it there.

// authorizeMove is Authorize for name, the LocalVolume that moves volume id
// to another node: allowed while that move is pulling, from this node, the
// volume this node holds.
func (a *TransferAuthorizer) authorizeMove(ctx context.Context, name, id string) (spec contract.CreateSpec, node, certPEM string, err error) {
	refuse := func(why string) (contract.CreateSpec, string, string, error) {
		return spec, "", "", fmt.Errorf("%w: LocalVolume %s %s", contract.ErrRefused, name, why)
	}
	mv := &v1.LocalVolume{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: name}, mv); apierrors.IsNotFound(err) {
		return spec, "", "", fmt.Errorf("%w: no LocalVolume %s", contract.ErrNotFound, name)
	} else if err != nil {
		return spec, "", "", err
	}
	cs := mv.Spec.ContentSource
	switch {
	case mv.Spec.MoveOf != id || contract.VolumeMoveName(id, mv.Spec.Node) != name:
		return refuse("is not a move of volume " + id)
	case cs == nil || cs.Volume != id || cs.Snapshot != "" || cs.Node != a.NodeID:
		return refuse("does not move volume " + id + " from node " + a.NodeID)
	case mv.Spec.Node == a.NodeID || mv.Labels[v1.NodeLabel] != mv.Spec.Node:
		return refuse("does not belong to another node")
	case mv.Deleting():
		return refuse("is being deleted")
	case mv.Status.Phase == v1.PhaseReady || mv.Status.Phase == v1.PhaseFailed:
		return refuse("is " + mv.Status.Phase + " already")
	}
	lv := &v1.LocalVolume{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: id}, lv); apierrors.IsNotFound(err) {
		return spec, "", "", fmt.Errorf("%w: no LocalVolume %s", contract.ErrNotFound, id)
	} else if err != nil {
		return spec, "", "", err
	}
	if lv.Spec.Node != a.NodeID || lv.Deleting() {
		return refuse("moves volume " + id + ", which is not held on node " + a.NodeID)
	}
	ln := &v1.LocalNode{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: mv.Spec.Node}, ln); err != nil {
		return spec, "", "", fmt.Errorf("read LocalNode %s: %w", mv.Spec.Node, err)
	}
	if ln.Status.Transfer == nil {
		return refuse("belongs to node " + mv.Spec.Node + ", which publishes no transfer certificate")
	}
	if spec, err = specOf(lv); err != nil {
		return spec, "", "", err
	}
	spec.SourceSnapshotID, spec.SourceVolumeID = "", id
	return spec, mv.Spec.Node, ln.Status.Transfer.Certificate, nil
}

// reconcileMove carries out a move LocalVolume of this node: pulls the
// volume, reports it Ready (Moved) once the whole of it has arrived and
// been verified, or removes what arrived when the move is called off.
func (r *LocalVolumeReconciler) reconcileMove(ctx context.Context, mv *v1.LocalVolume) (reconcile.Result, error) {
	if mv.Spec.DeleteData {
		return deleteRequested(ctx, r.Client, "LocalVolume", mv, func() error { return r.deleteMoved(ctx, mv) }, func(err error) { r.deleteBlocked(ctx, mv, err) })
	}
	if mv.DeletionTimestamp != nil || mv.Status.Phase == v1.PhaseReady || mv.Status.Phase == v1.PhaseFailed {
		return reconcile.Result{}, nil
	}
	orig := mv.DeepCopy()
	var retry time.Duration
	local, err := r.Store.Get(mv.Spec.MoveOf)
	switch {
	case errors.Is(err, contract.ErrNotFound) && r.Transfer == nil:
		mv.Status.Phase, mv.Status.ErrorCode = v1.PhaseFailed, v1.ErrorCode(codes.FailedPrecondition.String())
		setReady(&mv.Status.Conditions, mv.Generation, false, "MoveFailed", "this node plugin serves no transfer channel (no --transfer-address)")
	case errors.Is(err, contract.ErrNotFound):
		local, retry = r.pull(ctx, mv)
	case err != nil:
		return reconcile.Result{}, err
	}
	if local != nil {
		mv.Status.Phase, mv.Status.ErrorCode = v1.PhaseReady, ""
		mv.Status.CapacityBytes = quantity(local.CapacityBytes)
		mv.Status.Path = r.Store.DataPath(local)
		setReady(&mv.Status.Conditions, mv.Generation, true, "Moved",
			"a verified copy of volume "+mv.Spec.MoveOf+" from node "+mv.Spec.ContentSource.Node+" is on node "+r.NodeID)
		klog.InfoS("Volume moved here", "volumeID", mv.Spec.MoveOf, "from", mv.Spec.ContentSource.Node)
	}
	mv.Status.ObservedGeneration = mv.Generation
	if !equality.Semantic.DeepEqual(&orig.Status, &mv.Status) {
		if err := r.Client.Status().Patch(ctx, mv, client.MergeFrom(orig)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

// deleteMoved removes this node's copy of the volume mv moves: always
// after a DeleteVolume (v1.VolumeDeletedAnnotation); a move called off
// never removes the data of a volume whose own LocalVolume is on this node
// (a move already made) or has none at all (the copy may be all there is:
// it is re-adopted).
func (r *LocalVolumeReconciler) deleteMoved(ctx context.Context, mv *v1.LocalVolume) error {
	id := mv.Spec.MoveOf
	if mv.Annotations[v1.VolumeDeletedAnnotation] == "true" {
		return r.Store.Delete(id)
	}
	lv := &v1.LocalVolume{}
	err := r.Reader.Get(ctx, client.ObjectKey{Name: id}, lv)
	switch {
	case apierrors.IsNotFound(err):
		klog.InfoS("A move is called off while its volume has no LocalVolume; keeping its data here", "volumeID", id, "move", mv.Name)
		return nil
	case err != nil:
		return err
	case lv.Spec.Node == r.NodeID:
		klog.InfoS("A move is called off after it was made; keeping the volume's data", "volumeID", id, "move", mv.Name)
		return nil
	}
	return r.Store.Delete(id)
}
