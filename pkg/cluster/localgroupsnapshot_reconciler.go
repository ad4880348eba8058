package cluster

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// LocalGroupSnapshotReconciler cuts the LocalGroupSnapshots of one node
// (NodeSnapshots.CreateGroupWithIDs with the controller's member ids), then
// makes a LocalSnapshot per member. Deleting a group is the controller's.
type LocalGroupSnapshotReconciler struct {
	Client    client.Client
	NodeID    string
	Store     NodeStore
	Snapshots NodeSnapshots
}

// SetupWithManager registers the reconciler for LocalGroupSnapshots.
func (r *LocalGroupSnapshotReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("localgroupsnapshot").For(&v1.LocalGroupSnapshot{}).
		Complete(counted("LocalGroupSnapshot", r))
}

// Reconcile implements reconcile.Reconciler.
func (r *LocalGroupSnapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	g := &v1.LocalGroupSnapshot{}
	if err := r.Client.Get(ctx, req.NamespacedName, g); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if g.Spec.Node != r.NodeID || g.DeletionTimestamp != nil || g.Status.ReadyToUse || g.Status.Phase == v1.PhaseFailed {
		return reconcile.Result{}, nil
	}
	if g.Name != contract.GroupSnapshotIDFor(g.Spec.CSIName) {
		return reconcile.Result{}, r.failed(ctx, g, fmt.Errorf("%w: the object's name is not the group_snapshot_id of its csiName", contract.ErrInvalid))
	}
	cut, err := r.Snapshots.CreateGroupWithIDs(g.Spec.CSIName, g.Spec.Volumes, g.Spec.Snapshots)
	if errors.Is(err, contract.ErrBusy) {
		return reconcile.Result{RequeueAfter: busyRetry}, nil // a member is being changed
	}
	if err != nil {
		return reconcile.Result{}, r.failed(ctx, g, err)
	}
	for _, s := range cut.Snapshots {
		ls := &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: s.ID, Labels: map[string]string{v1.NodeLabel: r.NodeID}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: s.SourceVolumeID, Node: r.NodeID, GroupSnapshot: g.Name},
		}
		if err := r.Client.Create(ctx, ls); err != nil && !apierrors.IsAlreadyExists(err) {
			return reconcile.Result{}, err
		}
	}
	t := metav1.NewTime(cut.CreatedAt)
	g.Status.Phase, g.Status.ReadyToUse, g.Status.CreationTime, g.Status.ErrorCode = v1.PhaseReady, true, &t, ""
	setReady(&g.Status.Conditions, g.Generation, true, "Created", "the group's snapshots exist on node "+r.NodeID)
	klog.InfoS("Group snapshot cut", "groupSnapshotID", g.Name, "volumes", g.Spec.Volumes)
	return reconcile.Result{}, r.Client.Status().Update(ctx, g)
}

// failed records err in g's status (Failed, with its code).
func (r *LocalGroupSnapshotReconciler) failed(ctx context.Context, g *v1.LocalGroupSnapshot, err error) error {
	g.Status.Phase, g.Status.ErrorCode = v1.PhaseFailed, codeName(err)
	setReady(&g.Status.Conditions, g.Generation, false, "GroupSnapshotFailed", err.Error())
	klog.ErrorS(err, "Cannot cut group snapshot", "groupSnapshotID", g.Name)
	return r.Client.Status().Update(ctx, g)
}
