package cluster

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/client-go/tools/record"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// LocalVolumeReconciler carries out the LocalVolumes of one node: creates,
// grows and modifies their data, reports status, and removes it after
// spec.deleteData.
type LocalVolumeReconciler struct {
	Client client.Client
	// Reader reads uncached, for objects of other nodes (a move's volume).
	Reader    client.Reader
	NodeID    string
	Store     NodeStore
	Snapshots NodeSnapshots
	// Transfer pulls volumes whose source is on another node; nil: such a
	// volume fails (no channel).
	Transfer Transfer
	// Recorder, when set, gets the Events of transfers.
	Recorder record.EventRecorder
}

// SetupWithManager registers the reconciler for LocalVolumes (the
// manager's cache decides which: NodeAgent's holds its node's only).
func (r *LocalVolumeReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("localvolume").For(&v1.LocalVolume{}).
		Complete(counted("LocalVolume", r))
}

// Reconcile implements reconcile.Reconciler.
func (r *LocalVolumeReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lv := &v1.LocalVolume{}
	if err := r.Client.Get(ctx, req.NamespacedName, lv); apierrors.IsNotFound(err) {
		return reconcile.Result{}, r.data().readoptGone(ctx, "Volume", req.Name)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if lv.Spec.Node == r.NodeID && lv.Spec.MoveOf != "" && contract.VolumeOfMove(lv.Name) == lv.Spec.MoveOf {
		return r.reconcileMove(ctx, lv)
	}
	if lv.Spec.Node != r.NodeID || !contract.ValidVolumeID(lv.Name) {
		return reconcile.Result{}, nil
	}
	if lv.DeletionTimestamp != nil {
		// Deleted without DeleteVolume (by hand, or with its CRD): its data
		// stays, re-adopted once the object is gone (readoptGone).
		return reconcile.Result{}, nil
	}
	if lv.Spec.DeleteData {
		// DeleteVolume recorded its intent: the data goes, then the object.
		return deleteRequested(ctx, r.Client, "LocalVolume", lv, func() error { return r.Store.Delete(lv.Name) }, func(err error) { r.deleteBlocked(ctx, lv, err) })
	}
	orig := lv.DeepCopy()
	retry, err := r.carryOut(ctx, lv)
	if err != nil {
		return reconcile.Result{}, err
	} else if retry == busyRetry {
		return reconcile.Result{RequeueAfter: busyRetry}, nil
	}
	lv.Status.ObservedGeneration = lv.Generation
	if !equality.Semantic.DeepEqual(&orig.Status, &lv.Status) {
		// A merge patch: a transfer's progress writes moved the
		// resourceVersion on (this node plugin is the status's only writer).
		if err := r.Client.Status().Patch(ctx, lv, client.MergeFrom(orig)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

func (r *LocalVolumeReconciler) data() nodeData {
	return nodeData{r.Client, r.NodeID, r.Store, r.Snapshots}
}

// carryOut brings the node's data in line with lv and records the outcome in
// lv.Status. retry: when to look again — busyRetry after a conflicting
// operation (status not written), a transfer's backoff, or 0.
func (r *LocalVolumeReconciler) carryOut(ctx context.Context, lv *v1.LocalVolume) (retry time.Duration, err error) {
	local, err := r.Store.Get(lv.Name)
	notFound := errors.Is(err, contract.ErrNotFound)
	switch {
	case notFound && lv.Status.Phase == v1.PhaseReady:
		lv.Status.ErrorCode = dataLoss
		setReady(&lv.Status.Conditions, lv.Generation, false, "DataMissing",
			"the node holds no data for this volume although it was Ready; it was removed outside localdir")
		return 0, nil
	case notFound && lv.Status.Phase != v1.PhaseFailed:
		if cs := lv.Spec.ContentSource; cs != nil && cs.Node != "" && cs.Node != r.NodeID {
			if r.Transfer == nil {
				local, retry = nil, 0
				lv.Status.Phase, lv.Status.ErrorCode = v1.PhaseFailed, v1.ErrorCode(codes.FailedPrecondition.String())
				setReady(&lv.Status.Conditions, lv.Generation, false, "CreateFailed", "the source is on node "+cs.Node+" and this node plugin serves no transfer channel (no --transfer-address)")
			} else {
				local, retry = r.pull(ctx, lv)
			}
		} else {
			var busy bool
			if local, busy = r.create(lv); busy {
				retry = busyRetry
			}
		}
		if local == nil {
			return retry, nil
		}
	case err != nil:
		return 0, err
	}
	if r.ready(lv, local) {
		return busyRetry, nil
	}
	return 0, nil
}

// create creates lv's volume; a failure is recorded in lv.Status (Failed,
// with its code) and nil returned. busy: its source is being changed.
func (r *LocalVolumeReconciler) create(lv *v1.LocalVolume) (local *contract.Volume, busy bool) {
	spec, err := specOf(lv)
	if err == nil {
		local, err = r.Store.Create(spec)
	}
	if errors.Is(err, contract.ErrBusy) {
		return nil, true
	}
	if err != nil {
		lv.Status.Phase, lv.Status.ErrorCode = v1.PhaseFailed, codeName(err)
		setReady(&lv.Status.Conditions, lv.Generation, false, "CreateFailed", err.Error())
		klog.ErrorS(err, "Cannot create volume", "volumeID", lv.Name)
		return nil, false
	}
	klog.InfoS("Volume created for LocalVolume", "volumeID", lv.Name, "size", lv.Spec.Size.Value())
	return local, false
}

// ready grows local to lv's spec.size if smaller and records it Ready (with
// an expansion's error code). A growth the object does not report is expanded
// even when the record has the size: a node plugin killed between the record
// and an image's growth left the file smaller (TestCrashStormNodeMode).
func (r *LocalVolumeReconciler) ready(lv *v1.LocalVolume, local *contract.Volume) (busy bool) {
	size := lv.Spec.Size.Value()
	reported := lv.Status.CapacityBytes.Value()
	if size > local.CapacityBytes || (reported > 0 && size > reported) {
		if c, err := r.Store.Expand(lv.Name, size); errors.Is(err, contract.ErrBusy) {
			return true
		} else if err != nil {
			lv.Status.ErrorCode = codeName(err)
			setReady(&lv.Status.Conditions, lv.Generation, true, "ExpandFailed", err.Error())
		} else {
			local.CapacityBytes = c
			lv.Status.ErrorCode = ""
		}
	}
	if busy := r.modify(lv, local); busy {
		return true
	}
	lv.Status.Phase = v1.PhaseReady
	lv.Status.CapacityBytes = quantity(local.CapacityBytes)
	lv.Status.Path = r.Store.DataPath(local)
	if lv.Status.ErrorCode == "" {
		setReady(&lv.Status.Conditions, lv.Generation, true, "Created", "the volume's data exists on node "+r.NodeID)
	}
	return false
}

// modify applies the spec.mutableParameters local does not have in effect
// and records the outcome in lv.Status (the Modified condition,
// status.modifyErrorCode on failure). busy: a conflicting operation.
func (r *LocalVolumeReconciler) modify(lv *v1.LocalVolume, local *contract.Volume) (busy bool) {
	lv.Status.ModifyErrorCode = ""
	if !inEffect(lv.Spec.MutableParameters, local.MutableParameters) {
		v, err := r.Store.Modify(lv.Name, lv.Spec.MutableParameters)
		switch {
		case errors.Is(err, contract.ErrBusy):
			return true
		case err != nil:
			lv.Status.ModifyErrorCode = codeName(err)
			setCondition(&lv.Status.Conditions, v1.ConditionModified, lv.Generation, false, "ModifyFailed", err.Error())
			klog.ErrorS(err, "Cannot apply mutable parameters", "volumeID", lv.Name, "mutableParameters", lv.Spec.MutableParameters)
		default:
			local.MutableParameters = v.MutableParameters
			klog.InfoS("Mutable parameters applied", "volumeID", lv.Name, "mutableParameters", lv.Spec.MutableParameters)
		}
	}
	lv.Status.MutableParameters = local.MutableParameters
	if lv.Status.ModifyErrorCode == "" && len(lv.Spec.MutableParameters) > 0 {
		setCondition(&lv.Status.Conditions, v1.ConditionModified, lv.Generation, true, "InEffect", "the mutable parameters of the spec are in effect on node "+r.NodeID)
	}
	return false
}

// deleteBlocked reports in lv's status (phase Deleting, condition Ready
// False, reason DeleteBlocked) why its data cannot be removed yet.
func (r *LocalVolumeReconciler) deleteBlocked(ctx context.Context, lv *v1.LocalVolume, err error) {
	lv.Status.Phase = v1.PhaseDeleting
	setReady(&lv.Status.Conditions, lv.Generation, false, "DeleteBlocked", err.Error())
	_ = r.Client.Status().Update(ctx, lv)
	klog.ErrorS(err, "Cannot delete volume data yet", "volumeID", lv.Name)
}
