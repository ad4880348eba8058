package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Transfer is the node's end of the node-to-node channel as the node agent
// uses it (pkg/transfer's Identity and Client, wired by pkg/app).
type Transfer interface {
	// Address is where this node serves the channel (host:port).
	Address() string
	// CertificatePEM is the certificate this node authenticates with.
	CertificatePEM() string
	// RotateIfOld renews the key before its certificate expires.
	RotateIfOld() error
	// Pull opens the stream of volumeID's source from node at address,
	// which must authenticate with certPEM; base: a snapshot this node
	// holds that the source may send its difference from, or "".
	Pull(ctx context.Context, node, address, certPEM, volumeID, base string) (io.ReadCloser, error)
}

// TransferAuthorizer decides, from the API, what a peer may pull from this
// node: the data for volume V, only while V is a LocalVolume still being
// created on another node from a source on this one, and only by the
// holder of the certificate V's node published in its LocalNode (which
// pkg/transfer's Server checks against the client's).
type TransferAuthorizer struct {
	// Reader reads uncached: the target is another node's object.
	Reader client.Reader
	NodeID string
}

// Authorize returns the create whose source to send, the node it is made
// on and the certificate that node published.
func (a *TransferAuthorizer) Authorize(ctx context.Context, volumeID, base string) (spec contract.CreateSpec, node, certPEM string, err error) {
	if snap := contract.SnapshotOfCopy(volumeID); snap != "" {
		return a.authorizeCopy(ctx, volumeID, snap, base)
	}
	if id := contract.VolumeOfMove(volumeID); id != "" {
		return a.authorizeMove(ctx, volumeID, id)
	}
	lv := &v1.LocalVolume{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: volumeID}, lv); apierrors.IsNotFound(err) {
		return spec, "", "", fmt.Errorf("%w: no LocalVolume %s", contract.ErrNotFound, volumeID)
	} else if err != nil {
		return spec, "", "", err
	}
	cs := lv.Spec.ContentSource
	refuse := func(why string) (contract.CreateSpec, string, string, error) {
		return spec, "", "", fmt.Errorf("%w: LocalVolume %s %s", contract.ErrRefused, volumeID, why)
	}
	switch {
	case cs == nil || cs.Node != a.NodeID:
		return refuse("is not being created from data on node " + a.NodeID)
	case lv.Spec.Node == a.NodeID || lv.Labels[v1.NodeLabel] != lv.Spec.Node:
		return refuse("does not belong to another node")
	case lv.Deleting():
		return refuse("is being deleted")
	case lv.Status.Phase == v1.PhaseReady || lv.Status.Phase == v1.PhaseFailed:
		return refuse("is " + lv.Status.Phase + " already")
	}
	ln := &v1.LocalNode{}
	if err := a.Reader.Get(ctx, client.ObjectKey{Name: lv.Spec.Node}, ln); err != nil {
		return spec, "", "", fmt.Errorf("read LocalNode %s: %w", lv.Spec.Node, err)
	}
	if ln.Status.Transfer == nil {
		return refuse("belongs to node " + lv.Spec.Node + ", which publishes no transfer certificate")
	}
	spec, err = specOf(lv)
	return spec, lv.Spec.Node, ln.Status.Transfer.Certificate, err
}

// specOf is the create of lv's volume, its parameters parsed as
// CreateVolume parsed them: a value written by hand that they refuse fails
// the create with INVALID_ARGUMENT instead of falling back to a default.
// A move's is the create of the volume it moves, from no source of this
// node.
func specOf(lv *v1.LocalVolume) (contract.CreateSpec, error) {
	params, err := contract.ParseParams(lv.Spec.Parameters)
	if err != nil {
		return contract.CreateSpec{}, err
	}
	spec := contract.CreateSpec{
		ID:                lv.Name,
		Name:              lv.Spec.CSIName,
		SizeBytes:         lv.Spec.Size.Value(),
		AccessType:        accessType(lv.Spec.VolumeMode),
		FsType:            lv.Spec.FsType,
		Parameters:        lv.Spec.Parameters,
		MutableParameters: lv.Spec.MutableParameters,
		DirMode:           params.DirMode,
	}
	if lv.Spec.MoveOf != "" {
		spec.ID = lv.Spec.MoveOf
	} else if cs := lv.Spec.ContentSource; cs != nil {
		spec.SourceSnapshotID, spec.SourceVolumeID = cs.Snapshot, cs.Volume
	}
	return spec, nil
}

// transferRetry is the wait before attempt n+1 of a failed transfer: 2 s
// doubling up to 2 min.
func transferRetry(attempts int32) time.Duration {
	return time.Duration(math.Min(float64(2*time.Second)*math.Pow(2, float64(max(attempts-1, 0))), float64(2*time.Minute)))
}

// sourceGoneAfter is how long a transfer keeps trying while its source
// node has no fresh heartbeat before the volume fails; a source node
// without a heartbeat for that long fails a new transfer at once.
const sourceGoneAfter = 10 * time.Minute

// pull creates lv's volume from the data on node spec.contentSource.node.
// A failure the source or the data rules out for good (not found, does not
// fit, no room here, data that cannot leave its node) fails the volume;
// any other (the network, a node plugin restarting, a stream cut short or
// not matching its digest, a refusal while a key rotation is published)
// is recorded in status.transfer and retried after transferRetry, until
// the source node has been without a fresh heartbeat for sourceGoneAfter.
func (r *LocalVolumeReconciler) pull(ctx context.Context, lv *v1.LocalVolume) (local *contract.Volume, retry time.Duration) {
	cs := lv.Spec.ContentSource
	t, wait := beginAttempt(&lv.Status.Transfer, cs.Node)
	if wait > 0 {
		return nil, wait
	}
	lv.Status.Phase = v1.PhasePending
	fail := func(err error) (*contract.Volume, time.Duration) {
		lv.Status.Phase, lv.Status.ErrorCode = v1.PhaseFailed, codeName(err)
		t.LastError = err.Error()
		setReady(&lv.Status.Conditions, lv.Generation, false, "TransferFailed", err.Error())
		r.event(lv, "Warning", "TransferFailed", "copy from node %s failed: %v", cs.Node, err)
		klog.ErrorS(err, "Transfer failed for good", "volumeID", lv.Name, "sourceNode", cs.Node)
		return nil, 0
	}
	again := func(err error) (*contract.Volume, time.Duration) {
		t.LastError = err.Error()
		wait := transferRetry(t.Attempts)
		setReady(&lv.Status.Conditions, lv.Generation, false, "TransferRetrying",
			fmt.Sprintf("attempt %d to copy from node %s failed (%v); retrying in %s", t.Attempts, cs.Node, err, wait))
		r.event(lv, "Warning", "TransferRetrying", "attempt %d to copy from node %s failed: %v; retrying in %s", t.Attempts, cs.Node, err, wait)
		klog.ErrorS(err, "Transfer failed; retrying", "volumeID", lv.Name, "sourceNode", cs.Node, "attempt", t.Attempts, "retryIn", wait)
		return nil, wait
	}
	spec, err := specOf(lv)
	if err != nil {
		return fail(err)
	}
	params, err := contract.ParseParams(lv.Spec.Parameters)
	if err != nil {
		return fail(err)
	}
	ln := &v1.LocalNode{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: cs.Node}, ln); err != nil {
		if apierrors.IsNotFound(err) && time.Since(t.StartTime.Time) > sourceGoneAfter {
			return fail(fmt.Errorf("%w: the source node %s has no LocalNode: it is gone", contract.ErrNotFound, cs.Node))
		}
		return again(fmt.Errorf("read LocalNode %s: %w", cs.Node, err))
	}
	if ln.Status.Transfer == nil {
		return again(fmt.Errorf("node %s serves no transfer channel (its node plugin is older, or not running)", cs.Node))
	}
	// Gone: down for sourceGoneAfter, or down while this transfer has tried for that long.
	if age := time.Since(ln.Status.Heartbeat.Time); age > sourceGoneAfter || age > StaleAfter && time.Since(t.StartTime.Time) > sourceGoneAfter {
		return fail(fmt.Errorf("%w: the source node %s's node plugin has not reported for %s: the node is gone or down; restore from a snapshot held elsewhere", contract.ErrNotFound, cs.Node, age.Round(time.Second)))
	}
	r.event(lv, "Normal", "TransferStarted", "copying the data of %s from node %s (attempt %d)", sourceName(cs), cs.Node, t.Attempts)
	body, err := r.Transfer.Pull(ctx, cs.Node, ln.Status.Transfer.Address, ln.Status.Transfer.Certificate, lv.Name, "")
	if err != nil {
		if errors.Is(err, contract.ErrNotFound) || errors.Is(err, contract.ErrInvalid) || errors.Is(err, contract.ErrPrecondition) {
			return fail(err)
		}
		return again(err)
	}
	defer body.Close()
	prog := r.startProgress(ctx, lv)
	var in io.Reader = body
	if params.TransferBandwidth > 0 {
		in = &limitedReader{r: body, lim: rate.NewLimiter(rate.Limit(params.TransferBandwidth), 256<<10), ctx: ctx}
	}
	local, err = r.Store.Receive(spec, in, prog.update)
	done, total := prog.stop()
	t.BytesDone, t.BytesTotal = quantity(done), quantity(total)
	switch {
	case errors.Is(err, contract.ErrBusy):
		return nil, busyRetry
	case errors.Is(err, contract.ErrNoSpace), errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrOutOfRange):
		return fail(err)
	case err != nil:
		return again(err)
	}
	t.LastError, t.CompletionTime = "", ptrNow()
	r.event(lv, "Normal", "TransferDone", "copied and verified %s of data from node %s in %s", humanBytes(done), cs.Node, time.Since(t.StartTime.Time).Round(time.Second))
	return local, 0
}

func sourceName(cs *v1.ContentSource) string {
	if cs.Snapshot != "" {
		return "snapshot " + cs.Snapshot
	}
	return "volume " + cs.Volume
}

func ptrNow() *metav1.Time {
	t := metav1.Now()
	return &t
}

func humanBytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String() + "B (" + strconv.FormatInt(n, 10) + " bytes)"
}

// event records an Event on lv and on the PVC it was made for, if known.
func (r *LocalVolumeReconciler) event(lv *v1.LocalVolume, typ, reason, format string, args ...any) {
	if r.Recorder == nil {
		return
	}
	r.Recorder.Eventf(lv, typ, reason, format, args...)
	ns, name := lv.Annotations[v1.PVCNamespaceAnnotation], lv.Annotations[v1.PVCNameAnnotation]
	if ns != "" && name != "" {
		pvc := &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: name}
		r.Recorder.Eventf(pvc, typ, reason, "volume %s: "+format, append([]any{lv.Name}, args...)...)
	}
}

// progress publishes a running transfer's bytes in status.transfer every
// progressEvery, from its own goroutine, with a merge patch (the
// reconcile writes the final status).
type progress struct {
	mu          sync.Mutex
	done, total int64
	stopc       chan struct{}
	wg          sync.WaitGroup
}

const progressEvery = 2 * time.Second

func (r *LocalVolumeReconciler) startProgress(ctx context.Context, lv *v1.LocalVolume) *progress {
	return startProgress(ctx, func(done, total int64) {
		obj := lv.DeepCopy()
		base := obj.DeepCopy()
		// The stored object may hold no transfer yet: send all of it.
		base.Status.Transfer = nil
		obj.Status.Transfer.BytesDone, obj.Status.Transfer.BytesTotal = quantity(done), quantity(total)
		setReady(&obj.Status.Conditions, obj.Generation, false, "Transferring",
			fmt.Sprintf("copying from node %s: %s of about %s", obj.Status.Transfer.SourceNode, humanBytes(done), humanBytes(total)))
		if err := r.Client.Status().Patch(ctx, obj, client.MergeFrom(base)); err != nil {
			klog.InfoS("Cannot report transfer progress", "volumeID", lv.Name, "err", err)
		}
	})
}

// startProgress calls publish every progressEvery while the bytes done
// move on, until stop.
func startProgress(ctx context.Context, publish func(done, total int64)) *progress {
	p := &progress{stopc: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		var last int64 = -1
		for {
			select {
			case <-p.stopc:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p.mu.Lock()
			done, total := p.done, p.total
			p.mu.Unlock()
			if done == last {
				continue
			}
			last = done
			publish(done, total)
		}
	}()
	return p
}

func (p *progress) update(done, total int64) {
	p.mu.Lock()
	p.done, p.total = done, total
	p.mu.Unlock()
}

func (p *progress) stop() (int64, int64) {
	close(p.stopc)
	p.wg.Wait()
	return p.done, p.total
}

// limitedReader reads from r at most lim's rate.
type limitedReader struct {
	r   io.Reader
	lim *rate.Limiter
	ctx context.Context
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if len(p) > l.lim.Burst() {
		p = p[:l.lim.Burst()]
	}
	n, err := l.r.Read(p)
	if n > 0 {
		if werr := l.lim.WaitN(l.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}
