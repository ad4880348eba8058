package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/metrics"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// NodeAgent is the node plugin's operator half: it reconciles the
// LocalVolumes and LocalSnapshots of its own node (selected by the
// localdir.csi.dev/node label) with the same pkg/volume code all mode uses,
// and keeps its LocalNode current. On start it reconciles every object of
// its node. It removes data only for objects whose spec.deleteData the
// controller set (with the finalizer, which it then removes); data whose
// object went away otherwise stays and is re-adopted, or listed in
// LocalNode status.orphans while it cannot be.
type NodeAgent struct {
	NodeID         string
	VM             *volume.Manager
	Version        string
	MaxVolumeBytes int64
	// Heartbeat is how often LocalNode status is refreshed.
	Heartbeat time.Duration

	c           client.Client
	orphanCount atomic.Int64 // unclaimed data left after the last heartbeat
}

// Orphans is the number of volumes and snapshots on this node that no
// object claims and that could not be re-adopted, as of the last heartbeat.
func (a *NodeAgent) Orphans() int64 { return a.orphanCount.Load() }

// counted wraps a reconciler to count its failures in
// localdir_node_reconcile_errors_total.
func counted(kind string, f reconcile.Func) reconcile.Func {
	return func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		res, err := f(ctx, req)
		if err != nil {
			metrics.ReconcileErrors.WithLabelValues(kind).Inc()
		}
		return res, err
	}
}

// Start runs the agent until ctx is done.
func (a *NodeAgent) Start(ctx context.Context, cfg *rest.Config) error {
	ctrllog.SetLogger(klog.NewKlogr())
	sel := labels.SelectorFromSet(labels.Set{v1.NodeLabel: a.NodeID})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1.LocalVolume{}:   {Label: sel},
			&v1.LocalSnapshot{}: {Label: sel},
		}},
		HealthProbeBindAddress: "0",
		Logger:                 klog.NewKlogr(),
		// Several node agents may share a process (tests run three nodes);
		// controller names need not be unique then.
		// Volumes are independent: create them in parallel (one at a time,
		// 100 PVCs took 40 s on btrfs in the e2e scale test).
		Controller: config.Controller{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 8},
	})
	if err != nil {
		return err
	}
	a.c = mgr.GetClient()
	if a.Heartbeat == 0 {
		a.Heartbeat = 30 * time.Second
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("localvolume").For(&v1.LocalVolume{}).
		Complete(counted("LocalVolume", a.reconcileVolume)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("localsnapshot").For(&v1.LocalSnapshot{}).
		Complete(counted("LocalSnapshot", a.reconcileSnapshot)); err != nil {
		return err
	}
	if err := mgr.Add(ctrlRunnable(a.heartbeatLoop)); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// busyRetry is when a reconcile that met a conflicting operation on the
// same data (contract.ErrBusy: a restore reading a snapshot being deleted,
// say) runs again.
const busyRetry = 250 * time.Millisecond

type ctrlRunnable func(context.Context) error

func (f ctrlRunnable) Start(ctx context.Context) error { return f(ctx) }

func codeName(err error) string {
	if st, ok := status.FromError(contract.ToStatus(err)); ok {
		return st.Code().String()
	}
	return "Internal"
}

func setReady(conds *[]metav1.Condition, gen int64, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: v1.ConditionReady, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func (a *NodeAgent) reconcileVolume(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lv := &v1.LocalVolume{}
	if err := a.c.Get(ctx, req.NamespacedName, lv); apierrors.IsNotFound(err) {
		return reconcile.Result{}, a.readoptGone(ctx, "Volume", req.Name)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if lv.Spec.Node != a.NodeID || !volume.ValidVolumeID(lv.Name) {
		return reconcile.Result{}, nil
	}
	if lv.DeletionTimestamp != nil {
		return a.finishVolumeDelete(ctx, lv)
	}
	if err := a.dropLegacyFinalizer(ctx, lv, lv.Spec.DeleteData); err != nil {
		return reconcile.Result{}, err
	}
	before := lv.Status.DeepCopy()
	local, err := a.VM.Get(lv.Name)
	switch {
	case errors.Is(err, contract.ErrNotFound) && lv.Status.Phase == v1.PhaseReady:
		lv.Status.ErrorCode = "DataLoss"
		setReady(&lv.Status.Conditions, lv.Generation, false, "DataMissing",
			"the node holds no data for this volume although it was Ready; it was removed outside localdir")
	case errors.Is(err, contract.ErrNotFound) && lv.Status.Phase != v1.PhaseFailed:
		var spec volume.CreateSpec
		if spec, err = a.createSpec(lv); err == nil {
			local, err = a.VM.Create(spec)
		}
		if errors.Is(err, contract.ErrBusy) {
			// Its source is being deleted or changed: try again shortly
			// (it is then gone, NOT_FOUND, or free).
			return reconcile.Result{RequeueAfter: busyRetry}, nil
		}
		if err != nil {
			lv.Status.Phase, lv.Status.ErrorCode = v1.PhaseFailed, codeName(err)
			setReady(&lv.Status.Conditions, lv.Generation, false, "CreateFailed", err.Error())
			klog.ErrorS(err, "Cannot create volume", "volumeID", lv.Name)
			break
		}
		klog.InfoS("Volume created for LocalVolume", "volumeID", lv.Name, "size", lv.Spec.Size)
		fallthrough
	case err == nil && local != nil:
		if lv.Spec.Size > local.CapacityBytes {
			if c, err := a.VM.Expand(lv.Name, lv.Spec.Size); errors.Is(err, contract.ErrBusy) {
				return reconcile.Result{RequeueAfter: busyRetry}, nil
			} else if err != nil {
				lv.Status.ErrorCode = codeName(err)
				setReady(&lv.Status.Conditions, lv.Generation, true, "ExpandFailed", err.Error())
			} else {
				local.CapacityBytes = c
				lv.Status.ErrorCode = ""
			}
		}
		lv.Status.Phase = v1.PhaseReady
		lv.Status.CapacityBytes = local.CapacityBytes
		lv.Status.Path = a.VM.DataPath(local)
		if lv.Status.ErrorCode == "" {
			setReady(&lv.Status.Conditions, lv.Generation, true, "Created", "the volume's data exists on node "+a.NodeID)
		}
	case err != nil:
		return reconcile.Result{}, err
	}
	lv.Status.ObservedGeneration = lv.Generation
	if !equality.Semantic.DeepEqual(before, &lv.Status) {
		if err := a.c.Status().Update(ctx, lv); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

// createSpec is the create of lv's volume. Its parameters are parsed as the
// controller's CreateVolume parsed them (contract.ParseParams); a value it
// refuses (an object written by hand) fails the create with
// INVALID_ARGUMENT instead of falling back to a default.
func (a *NodeAgent) createSpec(lv *v1.LocalVolume) (volume.CreateSpec, error) {
	params, err := contract.ParseParams(lv.Spec.Parameters)
	if err != nil {
		return volume.CreateSpec{}, err
	}
	spec := volume.CreateSpec{
		ID:         lv.Name,
		Name:       lv.Spec.CSIName,
		SizeBytes:  lv.Spec.Size,
		AccessType: accessType(lv.Spec.VolumeMode),
		Parameters: lv.Spec.Parameters,
		DirMode:    params.DirMode,
	}
	if cs := lv.Spec.ContentSource; cs != nil {
		spec.SourceSnapshotID, spec.SourceVolumeID = cs.Snapshot, cs.Volume
	}
	return spec, nil
}

// dropLegacyFinalizer removes v1alpha1.Finalizer from a live object that
// carries no delete intent: earlier builds put it on every object, which
// made deleting the CRDs wait on the node plugins.
func (a *NodeAgent) dropLegacyFinalizer(ctx context.Context, obj client.Object, deleteData bool) error {
	if deleteData || !controllerutil.RemoveFinalizer(obj, v1.Finalizer) {
		return nil
	}
	return a.c.Update(ctx, obj)
}

// readoptGone re-adopts at once the data of an object that was just deleted
// without a delete intent (by hand, or with its CRD), instead of waiting for
// the next heartbeat. Data removed for a DeleteVolume/DeleteSnapshot is
// already gone when its object goes, so nothing is re-adopted then.
func (a *NodeAgent) readoptGone(ctx context.Context, kind, id string) error {
	var path string
	switch {
	case kind == "Volume" && volume.ValidVolumeID(id):
		v, err := a.VM.Get(id)
		if err != nil || v.Ephemeral {
			return nil
		}
		path = a.VM.DataPath(v)
	case kind == "Snapshot" && volume.ValidSnapshotID(id):
		s, err := a.VM.GetSnapshot(id)
		if err != nil {
			return nil
		}
		path = a.VM.SnapshotPath(s)
	default:
		return nil
	}
	klog.InfoS("Object deleted without a delete request; keeping its data", "kind", kind, "id", id, "path", path)
	a.readopt(ctx, []v1.OrphanedData{{ID: id, Kind: kind, Path: path}})
	return nil
}

// finishVolumeDelete acts on a deleted LocalVolume that holds the
// finalizer: with deleteData the data is removed (a mounted volume waits,
// with the reason in its condition); without it (objects from earlier builds)
// the data stays, to be re-adopted. Then the finalizer goes. An object
// without the finalizer is gone already, or about to be.
func (a *NodeAgent) finishVolumeDelete(ctx context.Context, lv *v1.LocalVolume) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(lv, v1.Finalizer) {
		return reconcile.Result{}, nil
	}
	if lv.Spec.DeleteData {
		if err := a.VM.Delete(lv.Name); errors.Is(err, contract.ErrBusy) {
			return reconcile.Result{RequeueAfter: busyRetry}, nil
		} else if err != nil {
			lv.Status.Phase = v1.PhaseDeleting
			setReady(&lv.Status.Conditions, lv.Generation, false, "DeleteBlocked", err.Error())
			_ = a.c.Status().Update(ctx, lv)
			klog.ErrorS(err, "Cannot delete volume data yet", "volumeID", lv.Name)
			return reconcile.Result{RequeueAfter: 10 * time.Second}, nil
		}
		klog.InfoS("Volume data deleted", "volumeID", lv.Name)
	} else if v, err := a.VM.Get(lv.Name); err == nil {
		klog.InfoS("LocalVolume deleted without a DeleteVolume call; keeping its data as an orphan",
			"volumeID", lv.Name, "path", a.VM.DataPath(v))
	}
	controllerutil.RemoveFinalizer(lv, v1.Finalizer)
	return reconcile.Result{}, client.IgnoreNotFound(a.c.Update(ctx, lv))
}

func (a *NodeAgent) reconcileSnapshot(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	ls := &v1.LocalSnapshot{}
	if err := a.c.Get(ctx, req.NamespacedName, ls); apierrors.IsNotFound(err) {
		return reconcile.Result{}, a.readoptGone(ctx, "Snapshot", req.Name)
	} else if err != nil {
		return reconcile.Result{}, err
	}
	if ls.Spec.Node != a.NodeID || !volume.ValidSnapshotID(ls.Name) {
		return reconcile.Result{}, nil
	}
	if ls.DeletionTimestamp != nil {
		if !controllerutil.ContainsFinalizer(ls, v1.Finalizer) {
			return reconcile.Result{}, nil
		}
		if ls.Spec.DeleteData {
			if err := a.VM.DeleteSnapshot(ls.Name); errors.Is(err, contract.ErrBusy) {
				return reconcile.Result{RequeueAfter: busyRetry}, nil // a restore reads it
			} else if err != nil {
				return reconcile.Result{}, err
			}
		} else {
			klog.InfoS("LocalSnapshot deleted without a DeleteSnapshot call; keeping its data as an orphan", "snapshotID", ls.Name)
		}
		controllerutil.RemoveFinalizer(ls, v1.Finalizer)
		return reconcile.Result{}, client.IgnoreNotFound(a.c.Update(ctx, ls))
	}
	if err := a.dropLegacyFinalizer(ctx, ls, ls.Spec.DeleteData); err != nil {
		return reconcile.Result{}, err
	}
	if ls.Status.ReadyToUse || ls.Status.Phase == v1.PhaseFailed {
		return reconcile.Result{}, nil
	}
	snap, err := a.VM.CreateSnapshot(volume.SnapshotSpec{ID: ls.Name, Name: ls.Spec.CSIName, SourceVolumeID: ls.Spec.SourceVolume})
	if errors.Is(err, contract.ErrBusy) {
		return reconcile.Result{RequeueAfter: busyRetry}, nil // its source is being expanded or deleted
	}
	if err != nil {
		ls.Status.Phase, ls.Status.ErrorCode = v1.PhaseFailed, codeName(err)
		setReady(&ls.Status.Conditions, ls.Generation, false, "SnapshotFailed", err.Error())
	} else {
		t := metav1.NewTime(snap.CreatedAt)
		ls.Status.Phase, ls.Status.ReadyToUse, ls.Status.SizeBytes, ls.Status.CreationTime = v1.PhaseReady, true, snap.SizeBytes, &t
		setReady(&ls.Status.Conditions, ls.Generation, true, "Created", "the snapshot exists on node "+a.NodeID)
	}
	return reconcile.Result{}, a.c.Status().Update(ctx, ls)
}

// heartbeatLoop writes LocalNode status now and every a.Heartbeat.
func (a *NodeAgent) heartbeatLoop(ctx context.Context) error {
	t := time.NewTicker(a.Heartbeat)
	defer t.Stop()
	for {
		if err := a.writeLocalNode(ctx); err != nil && ctx.Err() == nil {
			metrics.ReconcileErrors.WithLabelValues("LocalNode").Inc()
			klog.ErrorS(err, "Cannot update LocalNode", "node", a.NodeID)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (a *NodeAgent) writeLocalNode(ctx context.Context) error {
	ci, err := a.VM.Capacity()
	if err != nil {
		return err
	}
	ln := &v1.LocalNode{}
	err = a.c.Get(ctx, client.ObjectKey{Name: a.NodeID}, ln)
	if apierrors.IsNotFound(err) {
		ln = &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: a.NodeID}}
		if err := a.c.Create(ctx, ln); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err != nil {
		return err
	}
	orphans, err := a.orphans(ctx)
	if err != nil {
		return err
	}
	orphans = a.readopt(ctx, orphans)
	a.orphanCount.Store(int64(len(orphans)))
	patch := client.MergeFrom(ln.DeepCopy())
	ln.Status = v1.LocalNodeStatus{
		Engine:           a.VM.Engine(),
		CapacityBytes:    ci.Total,
		AllocatableBytes: ci.Available,
		FreeBytes:        ci.Free,
		MaxVolumeBytes:   a.MaxVolumeBytes,
		DriverVersion:    a.Version,
		Heartbeat:        metav1.Now(),
		Orphans:          orphans,
	}
	for _, l := range a.VM.Leftovers() {
		ln.Status.RecoveryProblems = append(ln.Status.RecoveryProblems, v1.RecoveryProblem{Path: l.Path, Problem: l.Problem})
	}
	// A merge patch: no resourceVersion conflict with a stale cache read.
	return a.c.Status().Patch(ctx, ln, patch)
}

// readopt re-creates the LocalVolume / LocalSnapshot objects for data this
// node holds but no object claims. Such data lost its object without a
// DeleteVolume/DeleteSnapshot (those remove the local record before the
// finalizer goes): its CRD was deleted, or the object was deleted by hand
// or a pending delete's finalizer cleared. Re-creating the object lets
// existing PVs work again with no manual step. The objects carry ReadoptedLabel. It returns
// the orphans it could not re-adopt (e.g. while the CRDs are missing).
func (a *NodeAgent) readopt(ctx context.Context, orphans []v1.OrphanedData) []v1.OrphanedData {
	var left []v1.OrphanedData
	for _, o := range orphans {
		var obj client.Object
		labels := map[string]string{v1.NodeLabel: a.NodeID, v1.ReadoptedLabel: "true"}
		switch o.Kind {
		case "Volume":
			v, err := a.VM.Get(o.ID)
			if err != nil {
				continue
			}
			lv := &v1.LocalVolume{
				ObjectMeta: metav1.ObjectMeta{Name: v.ID, Labels: labels},
				Spec: v1.LocalVolumeSpec{
					Node: a.NodeID, Size: v.CapacityBytes, VolumeMode: volumeMode(v.AccessType),
					Engine: v.Engine, Parameters: v.Parameters, CSIName: v.Name,
				},
			}
			if v.SourceSnapshotID != "" || v.SourceVolumeID != "" {
				lv.Spec.ContentSource = &v1.ContentSource{Snapshot: v.SourceSnapshotID, Volume: v.SourceVolumeID}
			}
			obj = lv
		case "Snapshot":
			s, err := a.VM.GetSnapshot(o.ID)
			if err != nil {
				continue
			}
			obj = &v1.LocalSnapshot{
				ObjectMeta: metav1.ObjectMeta{Name: s.ID, Labels: labels},
				Spec:       v1.LocalSnapshotSpec{SourceVolume: s.SourceVolumeID, Node: a.NodeID, CSIName: s.Name},
			}
		}
		err := a.c.Create(ctx, obj)
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
func (a *NodeAgent) orphans(ctx context.Context) ([]v1.OrphanedData, error) {
	lvs := &v1.LocalVolumeList{}
	if err := a.c.List(ctx, lvs); err != nil {
		return nil, err
	}
	lss := &v1.LocalSnapshotList{}
	if err := a.c.List(ctx, lss); err != nil {
		return nil, err
	}
	claimed := map[string]bool{}
	for _, o := range lvs.Items {
		claimed[o.Name] = true
	}
	for _, o := range lss.Items {
		claimed[o.Name] = true
	}
	var out []v1.OrphanedData
	vols, _, err := a.VM.List("", 0)
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if !claimed[v.ID] && !v.Ephemeral {
			out = append(out, v1.OrphanedData{ID: v.ID, Kind: "Volume", Path: a.VM.DataPath(v), SizeBytes: v.CapacityBytes})
		}
	}
	snaps, _, err := a.VM.ListSnapshots("", 0, "")
	if err != nil {
		return nil, err
	}
	for _, s := range snaps {
		if !claimed[s.ID] {
			out = append(out, v1.OrphanedData{ID: s.ID, Kind: "Snapshot", Path: a.VM.SnapshotPath(s), SizeBytes: s.SizeBytes})
		}
	}
	return out, nil
}
