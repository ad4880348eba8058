package cluster

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// LocalSnapshotReconciler carries out the LocalSnapshots of one node: it takes
// each once, reports it in status, and removes it after spec.deleteData.
type LocalSnapshotReconciler struct {
	Client    client.Client
	NodeID    string
	Store     NodeStore
	Snapshots NodeSnapshots
	// Reader reads uncached: a copy's snapshot is another node's object.
	Reader client.Reader
	// Transfer pulls the snapshots this node keeps copies of; nil: such
	// a copy fails (no channel).
	Transfer Transfer
	// Recorder, when set, gets the Events of copies.
	Recorder record.EventRecorder
}

// SetupWithManager registers the reconciler for LocalSnapshots.
func (r *LocalSnapshotReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("localsnapshot").For(&v1.LocalSnapshot{}).
		Complete(counted("LocalSnapshot", r))
}

// Reconcile implements reconcile.Reconciler.
func (r *LocalSnapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ls := &v1.LocalSnapshot{}
	if err := r.Client.Get(ctx, req.NamespacedName, ls); apierrors.IsNotFound(err) {
		return reconcile.Result{}, nodeData{r.Client, r.NodeID, r.Store, r.Snapshots}.readoptGone(ctx, "Snapshot", req.Name)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if ls.Spec.Node != r.NodeID {
		return reconcile.Result{}, nil
	}
	if ls.Spec.CopyOf != "" && contract.SnapshotOfCopy(ls.Name) == ls.Spec.CopyOf && ls.DeletionTimestamp == nil {
		return r.reconcileCopy(ctx, ls)
	}
	if !contract.ValidSnapshotID(ls.Name) {
		return reconcile.Result{}, nil
	}
	if ls.DeletionTimestamp != nil {
		// Deleted without DeleteSnapshot: its data stays, re-adopted once
		// the object is gone (readoptGone).
		return reconcile.Result{}, nil
	}
	if ls.Spec.DeleteData {
		// DeleteSnapshot recorded its intent: the data goes, then the object.
		return deleteRequested(ctx, r.Client, "LocalSnapshot", ls, func() error { return r.Snapshots.Delete(ls.Name) }, func(err error) { r.deleteBlocked(ctx, ls, err) })
	}
	if ls.Status.ReadyToUse || ls.Status.Phase == v1.PhaseFailed {
		return reconcile.Result{}, nil
	}
	if ls.Spec.GroupSnapshot != "" {
		// Cut with its group by the group's reconciler, never on its own
		// (it would not be of the group's point in time).
		if _, err := r.Snapshots.Get(ls.Name); errors.Is(err, contract.ErrNotFound) {
			ls.Status.Phase, ls.Status.ErrorCode = v1.PhaseFailed, codeName(err)
			setReady(&ls.Status.Conditions, ls.Generation, false, "GroupMemberMissing",
				"this node holds no snapshot "+ls.Name+" of group "+ls.Spec.GroupSnapshot+"; a member of a group is only cut with its group")
			return reconcile.Result{}, r.Client.Status().Update(ctx, ls)
		}
	}
	snap, err := r.Snapshots.Create(contract.SnapshotSpec{ID: ls.Name, Name: ls.Spec.CSIName, SourceVolumeID: ls.Spec.SourceVolume})
	if errors.Is(err, contract.ErrBusy) {
		return reconcile.Result{RequeueAfter: busyRetry}, nil // its source is being expanded or deleted
	}
	if err != nil {
		ls.Status.Phase, ls.Status.ErrorCode = v1.PhaseFailed, codeName(err)
		setReady(&ls.Status.Conditions, ls.Generation, false, "SnapshotFailed", err.Error())
	} else {
		t := metav1.NewTime(snap.CreatedAt)
		ls.Status.Phase, ls.Status.ReadyToUse, ls.Status.SizeBytes, ls.Status.CreationTime = v1.PhaseReady, true, quantity(snap.SizeBytes), &t
		ls.Status.VolumeMode, ls.Status.FsType = volumeMode(snap.AccessType), snap.FsType
		setReady(&ls.Status.Conditions, ls.Generation, true, "Created", "the snapshot exists on node "+r.NodeID)
	}
	return reconcile.Result{}, r.Client.Status().Update(ctx, ls)
}

// deleteBlocked reports why a requested delete cannot remove the data yet
// (phase Deleting, not ready to use, Ready False reason DeleteBlocked).
func (r *LocalSnapshotReconciler) deleteBlocked(ctx context.Context, ls *v1.LocalSnapshot, err error) {
	ls.Status.Phase, ls.Status.ReadyToUse = v1.PhaseDeleting, false
	setReady(&ls.Status.Conditions, ls.Generation, false, "DeleteBlocked", err.Error())
	_ = r.Client.Status().Update(ctx, ls)
	klog.ErrorS(err, "Cannot delete snapshot data yet", "snapshotID", ls.Name)
}
