package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Snapshot copies: a LocalSnapshot with spec.copyOf asks its node to hold
// a copy of a snapshot cut on another node (the VolumeSnapshotClass
// parameter copies). The node pulls it over the node-to-node channel once
// the snapshot is ready, and keeps it under the same snapshot_id, so a
// restore there is local and a restore elsewhere can come from it when the
// snapshot's own node is gone.

// authorizeCopy is Authorize for name, the LocalSnapshot that asks for a
// copy of snapshot snap: allowed while that copy is being made, on another
// node, of a snapshot this node cut and holds. base, when it is another
// snapshot of the same volume that this node cut and the copy's node holds
// a ready copy of, becomes the spec's BaseSnapshotID; any other is ignored
// (the whole snapshot is sent).
func (a *TransferAuthorizer) authorizeCopy(ctx context.Context, name, snap, base string) (spec contract.CreateSpec, node, certPEM string, err error) {
	refuse := func(why string) (contract.CreateSpec, string, string, error) {
		return spec, "", "", fmt.Errorf("%w: LocalSnapshot %s %s", contract.ErrRefused, name, why)
	}
	cp := &v1.LocalSnapshot{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: name}, cp); apierrors.IsNotFound(err) {
		return spec, "", "", fmt.Errorf("%w: no LocalSnapshot %s", contract.ErrNotFound, name)
	} else if err != nil {
		return spec, "", "", err
	}
	switch {
	case cp.Spec.CopyOf != snap || contract.SnapshotCopyName(snap, cp.Spec.Node) != name:
		return refuse("is not a copy of snapshot " + snap)
	case cp.Spec.Node == a.NodeID || cp.Labels[v1.NodeLabel] != cp.Spec.Node:
		return refuse("does not belong to another node")
	case cp.Deleting():
		return refuse("is being deleted")
	case cp.Status.Phase == v1.PhaseReady || cp.Status.Phase == v1.PhaseFailed:
		return refuse("is " + cp.Status.Phase + " already")
	}
	ls := &v1.LocalSnapshot{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: snap}, ls); apierrors.IsNotFound(err) {
		return spec, "", "", fmt.Errorf("%w: no LocalSnapshot %s", contract.ErrNotFound, snap)
	} else if err != nil {
		return spec, "", "", err
	}
	if ls.Spec.Node != a.NodeID {
		return refuse("copies snapshot " + snap + ", which is not cut on node " + a.NodeID)
	}
	ln := &v1.LocalNode{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: cp.Spec.Node}, ln); err != nil {
		return spec, "", "", fmt.Errorf("read LocalNode %s: %w", cp.Spec.Node, err)
	}
	if ln.Status.Transfer == nil {
		return refuse("belongs to node " + cp.Spec.Node + ", which publishes no transfer certificate")
	}
	spec = contract.CreateSpec{
		SourceSnapshotID: snap,
		SizeBytes:        ls.Status.SizeBytes.Value(),
		AccessType:       accessType(ls.Status.VolumeMode),
		FsType:           ls.Status.FsType,
	}
	if base != "" {
		if why := a.baseRefused(ctx, ls, base, cp.Spec.Node); why != "" {
			klog.InfoS("Snapshot copy: sending the whole snapshot, not its difference from the base asked for", "snapshotID", snap, "base", base, "node", cp.Spec.Node, "reason", why)
		} else {
			spec.BaseSnapshotID = base
		}
	}
	return spec, cp.Spec.Node, ln.Status.Transfer.Certificate, nil
}

// baseRefused says why snapshot base cannot be the base of an incremental
// copy of ls to node ("" when it can): it must be another snapshot of the
// same volume, cut on this node, with a ready copy on node.
func (a *TransferAuthorizer) baseRefused(ctx context.Context, ls *v1.LocalSnapshot, base, node string) string {
	b := &v1.LocalSnapshot{}
	if base == ls.Name {
		return "the snapshot itself"
	}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: base}, b); err != nil {
		return err.Error()
	}
	if b.Spec.Node != a.NodeID || b.Spec.CopyOf != "" || b.Spec.SourceVolume != ls.Spec.SourceVolume || !b.Status.ReadyToUse || b.Deleting() {
		return "not a ready snapshot of volume " + ls.Spec.SourceVolume + " cut on node " + a.NodeID
	}
	cp := &v1.LocalSnapshot{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: contract.SnapshotCopyName(base, node)}, cp); err != nil {
		return "no copy on node " + node + ": " + err.Error()
	}
	if cp.Spec.CopyOf != base || cp.Spec.Node != node || !cp.Status.ReadyToUse || cp.Deleting() {
		return "its copy on node " + node + " is not ready"
	}
	return ""
}

// reconcileCopy carries out a copy LocalSnapshot of this node.
func (r *LocalSnapshotReconciler) reconcileCopy(ctx context.Context, ls *v1.LocalSnapshot) (reconcile.Result, error) {
	if ls.Spec.DeleteData {
		return deleteRequested(ctx, r.Client, "LocalSnapshot", ls, func() error { return r.deleteCopy(ls.Spec.CopyOf) }, func(err error) { r.deleteBlocked(ctx, ls, err) })
	}
	if ls.Status.ReadyToUse || ls.Status.Phase == v1.PhaseFailed {
		return reconcile.Result{}, nil
	}
	orig := ls.DeepCopy()
	retry := r.copy(ctx, ls)
	if !equality.Semantic.DeepEqual(&orig.Status, &ls.Status) {
		if err := r.Client.Status().Patch(ctx, ls, client.MergeFrom(orig)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{RequeueAfter: retry}, nil
}

// deleteCopy removes this node's copy of snapshot id, never a snapshot
// cut here.
func (r *LocalSnapshotReconciler) deleteCopy(id string) error {
	s, err := r.Snapshots.Get(id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !s.Copy {
		klog.InfoS("A copy LocalSnapshot names a snapshot cut on this node; keeping its data", "snapshotID", id)
		return nil
	}
	return r.Snapshots.Delete(id)
}

// copy pulls the snapshot cp copies from its node and records the result
// in cp's status; it returns when to try again (0: done or failed).
func (r *LocalSnapshotReconciler) copy(ctx context.Context, cp *v1.LocalSnapshot) time.Duration {
	id := cp.Spec.CopyOf
	ls := &v1.LocalSnapshot{}
	err := r.Reader.Get(ctx, client.ObjectKey{Name: id}, ls)
	fail := func(err error) time.Duration {
		cp.Status.Phase, cp.Status.ErrorCode = v1.PhaseFailed, codeName(err)
		if cp.Status.Transfer != nil {
			cp.Status.Transfer.LastError = err.Error()
		}
		setReady(&cp.Status.Conditions, cp.Generation, false, "CopyFailed", err.Error())
		r.event(cp, "Warning", "CopyFailed", "copy of snapshot %s failed: %v", id, err)
		klog.ErrorS(err, "Snapshot copy failed for good", "snapshotID", id)
		return 0
	}
	switch {
	case apierrors.IsNotFound(err) || err == nil && ls.Deleting():
		return fail(fmt.Errorf("%w: snapshot %s is gone", contract.ErrNotFound, id))
	case err != nil:
		klog.InfoS("Cannot read the snapshot to copy; retrying", "snapshotID", id, "err", err)
		return transferRetry(1)
	case ls.Spec.Node == r.NodeID || ls.Spec.CopyOf != "":
		return fail(fmt.Errorf("%w: snapshot %s is not cut on another node", contract.ErrInvalid, id))
	case ls.Status.Phase == v1.PhaseFailed:
		return fail(fmt.Errorf("%w: snapshot %s failed on node %s", contract.ErrNotFound, id, ls.Spec.Node))
	case !ls.Status.ReadyToUse:
		cp.Status.Phase = v1.PhasePending
		setReady(&cp.Status.Conditions, cp.Generation, false, "WaitingForSnapshot", "snapshot "+id+" is not cut on node "+ls.Spec.Node+" yet")
		return transferRetry(1)
	}
	if s, err := r.Snapshots.Get(id); err == nil {
		return r.copied(cp, ls, s, 0)
	}
	t, wait := beginAttempt(&cp.Status.Transfer, ls.Spec.Node)
	if wait > 0 {
		return wait
	}
	cp.Status.Phase = v1.PhasePending
	again := func(err error) time.Duration {
		t.LastError = err.Error()
		wait := transferRetry(t.Attempts)
		setReady(&cp.Status.Conditions, cp.Generation, false, "CopyRetrying",
			fmt.Sprintf("attempt %d to copy from node %s failed (%v); retrying in %s", t.Attempts, ls.Spec.Node, err, wait))
		r.event(cp, "Warning", "CopyRetrying", "attempt %d to copy snapshot %s from node %s failed: %v; retrying in %s", t.Attempts, id, ls.Spec.Node, err, wait)
		klog.ErrorS(err, "Snapshot copy failed; retrying", "snapshotID", id, "sourceNode", ls.Spec.Node, "attempt", t.Attempts, "retryIn", wait)
		return wait
	}
	if r.Transfer == nil {
		return fail(fmt.Errorf("%w: this node plugin runs without the node-to-node channel (--transfer-address)", contract.ErrPrecondition))
	}
	ln := &v1.LocalNode{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: ls.Spec.Node}, ln); err != nil {
		return again(fmt.Errorf("read LocalNode %s: %w", ls.Spec.Node, err))
	}
	if age := time.Since(ln.Status.Heartbeat.Time); age > sourceGoneAfter || age > StaleAfter && time.Since(t.StartTime.Time) > sourceGoneAfter {
		return fail(fmt.Errorf("%w: the snapshot's node %s has not reported for %s: the node is gone or down", contract.ErrNotFound, ls.Spec.Node, age.Round(time.Second)))
	}
	if ln.Status.Transfer == nil {
		return again(fmt.Errorf("node %s serves no transfer channel (its node plugin is older, or not running)", ls.Spec.Node))
	}
	base := ""
	if t.Attempts <= 2 { // a base that keeps failing (a checksum mismatch) is given up
		base = r.copyBase(ctx, ls)
	}
	body, err := r.Transfer.Pull(ctx, ls.Spec.Node, ln.Status.Transfer.Address, ln.Status.Transfer.Certificate, cp.Name, base)
	if err != nil {
		if errors.Is(err, contract.ErrNotFound) || errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrPrecondition) {
			return fail(err)
		}
		return again(err)
	}
	defer body.Close()
	prog := startProgress(ctx, func(done, total int64) {
		obj := cp.DeepCopy()
		base := obj.DeepCopy()
		base.Status.Transfer = nil
		obj.Status.Transfer.BytesDone, obj.Status.Transfer.BytesTotal = quantity(done), quantity(total)
		setReady(&obj.Status.Conditions, obj.Generation, false, "Copying",
			fmt.Sprintf("copying from node %s: %s of about %s", ls.Spec.Node, humanBytes(done), humanBytes(total)))
		if err := r.Client.Status().Patch(ctx, obj, client.MergeFrom(base)); err != nil {
			klog.InfoS("Cannot report copy progress", "snapshotID", id, "err", err)
		}
	})
	name := ls.Spec.CSIName
	if name == "" {
		name = "\x00copy/" + id // a group member's: its record needs a name of its own
	}
	created := ls.CreationTimestamp.Time
	if ls.Status.CreationTime != nil {
		created = ls.Status.CreationTime.Time
	}
	var in io.Reader = body
	if bw := r.copyBandwidth(ctx, ls); bw > 0 {
		in = &limitedReader{r: body, lim: rate.NewLimiter(rate.Limit(bw), 256<<10), ctx: ctx}
	}
	s, err := r.Snapshots.Receive(contract.Snapshot{
		ID: id, Name: name, SourceVolumeID: ls.Spec.SourceVolume, SizeBytes: ls.Status.SizeBytes.Value(),
		AccessType: accessType(ls.Status.VolumeMode), FsType: ls.Status.FsType, CreatedAt: created.UTC(),
	}, base, in, prog.update)
	done, total := prog.stop()
	t.BytesDone, t.BytesTotal = quantity(done), quantity(total)
	switch {
	case errors.Is(err, contract.ErrBusy):
		return busyRetry
	case errors.Is(err, contract.ErrNoSpace), errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrOutOfRange):
		return fail(err)
	case err != nil:
		return again(err)
	}
	return r.copied(cp, ls, s, done)
}

// copyBase is the snapshot an image snapshot ls may be copied
// incrementally from: the newest other snapshot of the same volume, cut on
// ls's node, of which this node holds a copy; "" when there is none (or ls
// is a directory snapshot: those are copied whole). Any such snapshot
// gives a correct copy (the result is checked block for block); the newest
// differs least.
func (r *LocalSnapshotReconciler) copyBase(ctx context.Context, ls *v1.LocalSnapshot) string {
	if accessType(ls.Status.VolumeMode) != contract.AccessBlock && ls.Status.FsType == "" {
		return ""
	}
	list := &v1.LocalSnapshotList{}
	if err := r.Reader.List(ctx, list); err != nil {
		return ""
	}
	var best *v1.LocalSnapshot
	for i := range list.Items {
		b := &list.Items[i]
		if b.Name == ls.Name || b.Spec.CopyOf != "" || b.Spec.Node != ls.Spec.Node || b.Spec.SourceVolume != ls.Spec.SourceVolume ||
			!b.Status.ReadyToUse || b.Deleting() || b.Status.CreationTime == nil {
			continue
		}
		if s, err := r.Snapshots.Get(b.Name); err != nil || !s.Copy || !s.Image() {
			continue
		}
		if best == nil || best.Status.CreationTime.Before(b.Status.CreationTime) {
			best = b
		}
	}
	if best == nil {
		return ""
	}
	return best.Name
}

// copyBandwidth is the transferBandwidth of the class of ls's volume (0:
// none, or the volume is gone): a copy is capped as a restore is.
func (r *LocalSnapshotReconciler) copyBandwidth(ctx context.Context, ls *v1.LocalSnapshot) uint64 {
	lv := &v1.LocalVolume{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Name: ls.Spec.SourceVolume}, lv); err != nil {
		return 0
	}
	params, err := contract.ParseParams(lv.Spec.Parameters)
	if err != nil {
		return 0
	}
	return params.TransferBandwidth
}

// copied records cp as a complete copy of ls.
func (r *LocalSnapshotReconciler) copied(cp, ls *v1.LocalSnapshot, s *contract.Snapshot, bytes int64) time.Duration {
	t := cp.Status.Transfer
	if t == nil {
		t = &v1.VolumeTransfer{SourceNode: ls.Spec.Node, StartTime: ptrNow()}
		cp.Status.Transfer = t
	}
	t.LastError, t.CompletionTime = "", ptrNow()
	created := metav1.NewTime(s.CreatedAt)
	cp.Status.Phase, cp.Status.ReadyToUse, cp.Status.ErrorCode = v1.PhaseReady, true, ""
	cp.Status.SizeBytes, cp.Status.CreationTime = quantity(s.SizeBytes), &created
	cp.Status.VolumeMode, cp.Status.FsType = volumeMode(s.AccessType), s.FsType
	setReady(&cp.Status.Conditions, cp.Generation, true, "Copied", "a verified copy of snapshot "+ls.Name+" from node "+ls.Spec.Node+" is on node "+r.NodeID)
	r.event(cp, "Normal", "CopyDone", "copied and verified %s of snapshot %s from node %s in %s", humanBytes(bytes), ls.Name, ls.Spec.Node, time.Since(t.StartTime.Time).Round(time.Second))
	return 0
}

// beginAttempt starts the next attempt of the transfer *tp from node
// source (a new transfer when there is none, or another source's), or
// returns the rest of the backoff after a failed one.
func beginAttempt(tp **v1.VolumeTransfer, source string) (*v1.VolumeTransfer, time.Duration) {
	t := *tp
	if t == nil || t.SourceNode != source {
		t = &v1.VolumeTransfer{SourceNode: source, StartTime: ptrNow()}
		*tp = t
	}
	if t.LastAttemptTime != nil && t.LastError != "" {
		// A status write of this node woke the reconcile: wait out the backoff.
		if wait := time.Until(t.LastAttemptTime.Add(transferRetry(t.Attempts))); wait > 0 {
			return t, wait
		}
	}
	t.Attempts++
	t.LastAttemptTime = ptrNow()
	t.BytesDone, t.BytesTotal = resource.Quantity{}, resource.Quantity{}
	return t, 0
}

// event records an Event on a copy LocalSnapshot.
func (r *LocalSnapshotReconciler) event(cp *v1.LocalSnapshot, typ, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(cp, typ, reason, format, args...)
	}
}
