package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Waiting for a node plugin to carry out an object the controller wrote.

// waitCtx bounds a wait by b.Wait or by the caller's deadline, less a
// margin (a tenth of the time left, at most 1 s) so that the answer — a
// DEADLINE_EXCEEDED saying what the node plugin is doing — reaches the
// caller before its own gRPC deadline cuts the call off with a bare one.
func (b *ControllerBackend) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-min(time.Second, time.Until(dl)/10)))
	}
	return context.WithTimeout(ctx, b.Wait)
}

// awaitCache calls cond with the cached state of object name of kind (nil and
// false while absent) now and after each change, until it is done or ctx ends.
func (b *ControllerBackend) awaitCache(ctx context.Context, kind string, inf cache.SharedIndexInformer, name string, cond func(obj client.Object, ok bool) (bool, error)) error {
	woken, stop := b.cache.subscribe(kind, name)
	defer stop()
	for {
		obj, ok := get[client.Object](inf, name)
		if finished, err := cond(obj, ok); finished || err != nil {
			return err
		}
		select {
		case <-woken:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitFor waits on cache events until done says object name of kind is done.
// known: just created; otherwise one GET (objType) tells whether one the cache
// lacks exists. Out of time is DEADLINE_EXCEEDED, the object gone ABORTED.
func (b *ControllerBackend) waitFor(ctx context.Context, kind string, inf cache.SharedIndexInformer, objType client.Object, name string, known bool, done func(client.Object) (bool, error)) error {
	ctx, cancel := b.waitCtx(ctx)
	defer cancel()
	gone := fmt.Errorf("%w: %s was deleted while waiting for it", contract.ErrBusy, name)
	seen := false // by the cache
	err := b.awaitCache(ctx, kind, inf, name, func(obj client.Object, ok bool) (bool, error) {
		switch {
		case ok:
			seen = true
			return done(obj)
		case seen:
			return true, gone
		case !known:
			// A first read fails fast where the wait would last until the
			// deadline (an object never created, a missing permission).
			if err := b.c.Get(ctx, client.ObjectKey{Name: name}, objType); apierrors.IsNotFound(err) {
				return true, gone
			} else if err != nil {
				return true, err
			}
			known = true
		}
		return false, nil
	})
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return fmt.Errorf("timed out waiting for the node plugin on %s; the call can be retried and will pick the same object up: %w", name, context.DeadlineExceeded)
	}
	return err
}

// reportedCodes are the gRPC code names a node plugin writes to
// status.errorCode (codes.Code.String(), the API's ErrorCode enum).
var reportedCodes = map[v1.ErrorCode]codes.Code{
	"OK": codes.OK, "Canceled": codes.Canceled, "Unknown": codes.Unknown,
	"InvalidArgument": codes.InvalidArgument, "DeadlineExceeded": codes.DeadlineExceeded,
	"NotFound": codes.NotFound, "AlreadyExists": codes.AlreadyExists,
	"PermissionDenied": codes.PermissionDenied, "ResourceExhausted": codes.ResourceExhausted,
	"FailedPrecondition": codes.FailedPrecondition, "Aborted": codes.Aborted,
	"OutOfRange": codes.OutOfRange, "Unimplemented": codes.Unimplemented,
	"Internal": codes.Internal, "Unavailable": codes.Unavailable, "DataLoss": codes.DataLoss,
	"Unauthenticated": codes.Unauthenticated,
}

// failure turns a Failed object's status into the error the node reported,
// with its gRPC code (an unknown code name is INTERNAL).
func failure(errorCode v1.ErrorCode, conds []metav1.Condition, what string) error {
	return failureOf(v1.ConditionReady, errorCode, conds, what)
}

// failureOf is failure with the message of condition condType.
func failureOf(condType string, errorCode v1.ErrorCode, conds []metav1.Condition, what string) error {
	msg := what + " failed on its node"
	for _, c := range conds {
		if c.Type == condType && c.Message != "" {
			msg = what + ": " + c.Message
		}
	}
	code, ok := reportedCodes[errorCode]
	if !ok {
		code = codes.Internal
	}
	return &contract.Reported{Code: code, Message: msg}
}

// waitVolume waits until volume id is Ready or Failed (known: the caller
// has just created it).
func (b *ControllerBackend) waitVolume(ctx context.Context, id string, known bool) (*contract.Volume, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, "LocalVolume", b.cache.volumes, &v1.LocalVolume{}, id, known,
		func(o client.Object) (bool, error) {
			lv = o.(*v1.LocalVolume)
			if lv.Deleting() {
				return true, fmt.Errorf("%w: volume %s of the same name is being deleted; retry later", contract.ErrBusy, id)
			}
			switch lv.Status.Phase {
			case v1.PhaseReady:
				return true, nil
			case v1.PhaseFailed:
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "volume "+id)
			}
			return false, nil
		})
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			// Say what the node plugin is doing (a transfer retrying, and
			// why): the provisioner puts this message in the PVC's Events.
			if c := meta.FindStatusCondition(lv.Status.Conditions, v1.ConditionReady); c != nil && c.Status != metav1.ConditionTrue && c.Message != "" {
				err = fmt.Errorf("%w (%s: %s)", err, c.Reason, c.Message)
			}
		}
		if lv.Status.Phase == v1.PhaseFailed {
			// Remove the failed attempt so a retry starts afresh; it holds
			// no data.
			_ = b.remove(ctx, lv)
		}
		return nil, err
	}
	return toVolume(lv), nil
}

// waitExpanded waits until volume id's node reports at least size bytes, or
// an error for generation gen or later: an older cached state may still show
// an earlier attempt's error.
func (b *ControllerBackend) waitExpanded(ctx context.Context, id string, size, gen int64) (int64, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, "LocalVolume", b.cache.volumes, &v1.LocalVolume{}, id, true,
		func(o client.Object) (bool, error) {
			lv = o.(*v1.LocalVolume)
			if lv.Status.CapacityBytes.Value() >= size {
				return true, nil
			}
			if lv.Generation >= gen && lv.Status.ObservedGeneration >= lv.Generation && lv.Status.ErrorCode != "" {
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "expansion of "+id)
			}
			return false, nil
		})
	if err != nil {
		return 0, err
	}
	return lv.Status.CapacityBytes.Value(), nil
}

// waitSnapshot waits until snapshot id is ready to use or Failed (known:
// the caller has just created it).
func (b *ControllerBackend) waitSnapshot(ctx context.Context, id string, known bool) (*contract.Snapshot, error) {
	ls := &v1.LocalSnapshot{}
	err := b.waitFor(ctx, "LocalSnapshot", b.cache.snapshots, &v1.LocalSnapshot{}, id, known,
		func(o client.Object) (bool, error) {
			ls = o.(*v1.LocalSnapshot)
			if ls.Deleting() {
				return true, fmt.Errorf("%w: snapshot %s of the same name is being deleted; retry later", contract.ErrBusy, id)
			}
			if ls.Status.ReadyToUse {
				return true, nil
			}
			if ls.Status.Phase == v1.PhaseFailed {
				return true, failure(ls.Status.ErrorCode, ls.Status.Conditions, "snapshot "+id)
			}
			return false, nil
		})
	if err != nil {
		if ls.Status.Phase == v1.PhaseFailed {
			_ = b.removeSnapshot(ctx, ls)
		}
		return nil, err
	}
	return toSnapshot(ls), nil
}

// waitModified waits until volume id's node reports want in effect, or an
// error for generation gen or later.
func (b *ControllerBackend) waitModified(ctx context.Context, id string, want map[string]string, gen int64) (*v1.LocalVolume, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, "LocalVolume", b.cache.volumes, &v1.LocalVolume{}, id, true,
		func(o client.Object) (bool, error) {
			lv = o.(*v1.LocalVolume)
			if lv.Generation < gen || lv.Status.ObservedGeneration < lv.Generation {
				return false, nil
			}
			if lv.Status.ModifyErrorCode != "" {
				return true, failureOf(v1.ConditionModified, lv.Status.ModifyErrorCode, lv.Status.Conditions, "modify of volume "+id)
			}
			return inEffect(want, lv.Status.MutableParameters), nil
		})
	return lv, err
}

// inEffect tells whether every parameter of want has its value in have.
func inEffect(want, have map[string]string) bool {
	for k, v := range want {
		if hv, ok := have[k]; !ok || hv != v {
			return false
		}
	}
	return true
}
