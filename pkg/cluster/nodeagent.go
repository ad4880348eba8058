package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// NodeAgent is the node plugin's operator half: a controller-runtime manager
// caching only its node's objects runs their reconcilers (the pkg/volume code
// all mode uses) and the LocalNodeHeartbeat. It removes data only after the
// controller set spec.deleteData; data whose object went otherwise is
// re-adopted, or listed in LocalNode status.orphans.
type NodeAgent struct {
	NodeID         string
	Store          NodeStore
	Snapshots      NodeSnapshots
	Version        string
	MaxVolumeBytes int64
	// Heartbeat is how often LocalNode status is refreshed.
	Heartbeat time.Duration
	// Transfer is the node-to-node channel (published in LocalNode status,
	// used to pull); nil: none.
	Transfer Transfer

	orphanCount atomic.Int64 // unclaimed data left after the last heartbeat
}

// Orphans is the number of volumes and snapshots on this node that no
// object claims and that could not be re-adopted, as of the last heartbeat.
func (a *NodeAgent) Orphans() int64 { return a.orphanCount.Load() }

// Start runs the agent until ctx is done.
func (a *NodeAgent) Start(ctx context.Context, cfg *rest.Config) error {
	ctrllog.SetLogger(klog.NewKlogr())
	sel := labels.SelectorFromSet(labels.Set{v1.NodeLabel: a.NodeID})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:  Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&v1.LocalVolume{}:        {Label: sel},
			&v1.LocalSnapshot{}:      {Label: sel},
			&v1.LocalGroupSnapshot{}: {Label: sel},
		}},
		HealthProbeBindAddress: "0",
		Logger:                 klog.NewKlogr(),
		// Agents may share a process (tests), so names need not be unique.
		// Volumes are independent: reconcile them in parallel (one at a time
		// makes 100 PVCs on btrfs take 40 s in the e2e scale test).
		Controller: config.Controller{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: reconcileWorkers},
	})
	if err != nil {
		return err
	}
	c := mgr.GetClient()
	lvr := &LocalVolumeReconciler{Client: c, Reader: mgr.GetAPIReader(), NodeID: a.NodeID, Store: a.Store, Snapshots: a.Snapshots, Transfer: a.Transfer,
		Recorder: mgr.GetEventRecorderFor("localdir-node")}
	if err := lvr.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&LocalSnapshotReconciler{Client: c, NodeID: a.NodeID, Store: a.Store, Snapshots: a.Snapshots,
		Reader: mgr.GetAPIReader(), Transfer: a.Transfer, Recorder: mgr.GetEventRecorderFor("localdir-node")}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&LocalGroupSnapshotReconciler{Client: c, NodeID: a.NodeID, Store: a.Store, Snapshots: a.Snapshots}).SetupWithManager(mgr); err != nil {
		return err
	}
	hb := &LocalNodeHeartbeat{
		Client: c, NodeID: a.NodeID, Store: a.Store, Snapshots: a.Snapshots, Version: a.Version, MaxVolumeBytes: a.MaxVolumeBytes,
		Interval: a.Heartbeat, Orphans: &a.orphanCount, Transfer: a.Transfer,
	}
	if err := mgr.Add(hb); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// reconcileWorkers is how many LocalVolumes (and, apart, LocalSnapshots and
// LocalGroupSnapshots) a node agent carries out at once. A reconcile mostly
// waits on the API server and fsync, so workers are cheap: a burst of 1,000
// PVCs waited 0.55 s for a worker with 16, 1.4 ms with 64 (docs/benchmarks.md).
const reconcileWorkers = 64

// busyRetry is when a reconcile that met contract.ErrBusy (a conflicting
// operation on the same data) runs again.
const busyRetry = 250 * time.Millisecond

// counted wraps a reconciler to count its failures in
// localdir_node_reconcile_errors_total.
func counted(kind string, r reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		res, err := r.Reconcile(ctx, req)
		if err != nil {
			metrics.ReconcileErrors.WithLabelValues(kind).Inc()
		}
		return res, err
	})
}

// codeName is the status.errorCode of err: the name of the gRPC code
// contract.ToStatus gives it.
func codeName(err error) v1.ErrorCode {
	return v1.ErrorCode(status.Code(contract.ToStatus(err)).String())
}

// dataLoss is the status.errorCode of a Ready volume whose data vanished.
var dataLoss = v1.ErrorCode(codes.DataLoss.String())

func setReady(conds *[]metav1.Condition, gen int64, ok bool, reason, msg string) {
	setCondition(conds, v1.ConditionReady, gen, ok, reason, msg)
}

func setCondition(conds *[]metav1.Condition, typ string, gen int64, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	meta.SetStatusCondition(conds, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// deleteRequested carries out a delete recorded in spec.deleteData: remove
// removes the data, then the object is deleted with its UID as precondition,
// ending the handshake without a finalizer. contract.ErrBusy is retried after
// busyRetry; other failures are reported through blocked, after deleteRetry.
func deleteRequested(ctx context.Context, c client.Client, kind string, obj client.Object, remove func() error, blocked func(error)) (reconcile.Result, error) {
	if err := remove(); errors.Is(err, contract.ErrBusy) {
		return reconcile.Result{RequeueAfter: busyRetry}, nil
	} else if err != nil {
		blocked(err)
		metrics.ReconcileErrors.WithLabelValues(kind).Inc()
		return reconcile.Result{RequeueAfter: deleteRetry}, nil
	}
	klog.InfoS("Data deleted; deleting its object", "kind", kind, "id", obj.GetName())
	uid := obj.GetUID()
	return reconcile.Result{}, client.IgnoreNotFound(c.Delete(ctx, obj, client.Preconditions{UID: &uid}))
}

// deleteRetry is when a delete whose data could not be removed (other
// than busy) is tried again.
const deleteRetry = 10 * time.Second
