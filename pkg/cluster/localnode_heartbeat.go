package cluster

import (
	"context"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// LocalNodeHeartbeat is a manager.Runnable that writes its node's LocalNode
// status now and every Interval, re-adopting orphaned data first.
type LocalNodeHeartbeat struct {
	Client         client.Client
	NodeID         string
	Store          NodeStore
	Snapshots      NodeSnapshots
	Version        string
	MaxVolumeBytes int64
	// Interval between writes (0: 30 s).
	Interval time.Duration
	// Orphans, when set, receives the number of orphans after each write.
	Orphans *atomic.Int64
	// Transfer, when set, is published (address and certificate), its key
	// renewed first when it is old.
	Transfer Transfer
}

// Start implements manager.Runnable: it writes until ctx is done.
func (h *LocalNodeHeartbeat) Start(ctx context.Context) error {
	if h.Interval == 0 {
		h.Interval = 30 * time.Second
	}
	t := time.NewTicker(h.Interval)
	defer t.Stop()
	for {
		if err := h.write(ctx); err != nil && ctx.Err() == nil {
			metrics.ReconcileErrors.WithLabelValues("LocalNode").Inc()
			klog.ErrorS(err, "Cannot update LocalNode", "node", h.NodeID)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (h *LocalNodeHeartbeat) write(ctx context.Context) error {
	ci, err := h.Store.Capacity()
	if err != nil {
		return err
	}
	ln := &v1.LocalNode{}
	err = h.Client.Get(ctx, client.ObjectKey{Name: h.NodeID}, ln)
	if apierrors.IsNotFound(err) {
		ln = &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: h.NodeID}}
		if err := h.Client.Create(ctx, ln); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err != nil {
		return err
	}
	data := nodeData{h.Client, h.NodeID, h.Store, h.Snapshots}
	orphans, err := data.orphans(ctx)
	if err != nil {
		return err
	}
	orphans = data.readopt(ctx, orphans)
	if h.Orphans != nil {
		h.Orphans.Store(int64(len(orphans)))
	}
	patch := client.MergeFrom(ln.DeepCopy())
	ln.Status = v1.LocalNodeStatus{
		Engine:           string(h.Store.Engine()),
		CapacityBytes:    quantity(ci.Total),
		AllocatableBytes: quantity(ci.Available),
		AllocatedBytes:   quantity(ci.Allocated),
		HeadroomBytes:    quantity(ci.Headroom),
		FreeBytes:        quantity(ci.Free),
		MaxVolumeBytes:   quantity(h.MaxVolumeBytes),
		DriverVersion:    h.Version,
		Heartbeat:        metav1.Now(),
		Orphans:          orphans,
	}
	if h.Transfer != nil {
		if err := h.Transfer.RotateIfOld(); err != nil {
			klog.ErrorS(err, "Cannot renew the transfer key; the current one stays in use")
		}
		ln.Status.Transfer = &v1.TransferEndpoint{Address: h.Transfer.Address(), Certificate: h.Transfer.CertificatePEM()}
	}
	for _, l := range h.Store.Leftovers() {
		ln.Status.RecoveryProblems = append(ln.Status.RecoveryProblems, v1.RecoveryProblem{Path: l.Path, Problem: l.Problem})
	}
	// A merge patch: no resourceVersion conflict with a stale cache read.
	return h.Client.Status().Patch(ctx, ln, patch)
}
