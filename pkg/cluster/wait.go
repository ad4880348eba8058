package cluster

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	toolswatch "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Waiting for a node plugin to carry out an object the controller wrote.

// waitCtx bounds a wait by the caller's deadline or b.Wait.
func (b *ControllerBackend) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, b.Wait)
}

// waitFor watches the object named name (an objType, listed as newList())
// until done, called with each state of it, says it is finished or failed.
// Running out of time is DEADLINE_EXCEEDED, the object going away ABORTED.
func (b *ControllerBackend) waitFor(ctx context.Context, objType client.Object, newList func() client.ObjectList, name string, done func(client.Object) (bool, error)) error {
	ctx, cancel := b.waitCtx(ctx)
	defer cancel()
	only := fields.OneTermEqualSelector("metadata.name", name)
	lw := listThenWatch{&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l := newList()
			return l, b.c.List(ctx, l, &client.ListOptions{FieldSelector: only, Raw: &o})
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return b.c.Watch(ctx, newList(), &client.ListOptions{FieldSelector: only, Raw: &o})
		},
	}}
	gone := fmt.Errorf("%w: %s was deleted while waiting for it", contract.ErrBusy, name)
	// A first read fails fast where the informer below would retry until
	// the deadline (a missing permission, say).
	if err := b.c.Get(ctx, client.ObjectKey{Name: name}, objType); apierrors.IsNotFound(err) {
		return gone
	} else if err != nil {
		return err
	}
	var failed error // done's verdict, as opposed to the wait's own errors
	exists := func(store cache.Store) (bool, error) {
		if _, ok, err := store.GetByKey(name); err != nil || !ok {
			return false, gone
		}
		return false, nil
	}
	_, err := toolswatch.UntilWithSync(ctx, lw, objType, exists, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, gone
		}
		obj, ok := ev.Object.(client.Object)
		if !ok {
			return false, nil
		}
		ok, failed = done(obj)
		return ok, failed
	})
	if err != nil && err != failed && err != gone && ctx.Err() != nil {
		return fmt.Errorf("timed out waiting for the node plugin on %s; the call can be retried and will pick the same object up: %w", name, context.DeadlineExceeded)
	}
	return err
}

// listThenWatch makes the reflector of watch.UntilWithSync list, then
// watch (as the watch loop it replaced did: get, then watch), instead of
// asking for the initial state as a stream of watch events (WatchList),
// which a client that does not pass that request on (controller-runtime's
// fake client) never ends.
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is what client-go's reflector asks.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

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
	msg := what + " failed on its node"
	for _, c := range conds {
		if c.Type == v1.ConditionReady && c.Message != "" {
			msg = what + ": " + c.Message
		}
	}
	code, ok := reportedCodes[errorCode]
	if !ok {
		code = codes.Internal
	}
	return &contract.Reported{Code: code, Message: msg}
}

func (b *ControllerBackend) waitVolume(ctx context.Context, id string) (*contract.Volume, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, &v1.LocalVolume{}, func() client.ObjectList { return &v1.LocalVolumeList{} }, id,
		func(o client.Object) (bool, error) {
			lv = o.(*v1.LocalVolume)
			switch lv.Status.Phase {
			case v1.PhaseReady:
				return true, nil
			case v1.PhaseFailed:
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "volume "+id)
			}
			return false, nil
		})
	if err != nil {
		if lv.Status.Phase == v1.PhaseFailed {
			// Remove the failed attempt so a retry starts afresh; it holds
			// no data.
			_ = b.remove(ctx, lv)
		}
		return nil, err
	}
	return toVolume(lv), nil
}

// waitExpanded waits until volume id's node reports at least size bytes.
func (b *ControllerBackend) waitExpanded(ctx context.Context, id string, size int64) (int64, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, &v1.LocalVolume{}, func() client.ObjectList { return &v1.LocalVolumeList{} }, id,
		func(o client.Object) (bool, error) {
			lv = o.(*v1.LocalVolume)
			if lv.Status.CapacityBytes.Value() >= size {
				return true, nil
			}
			if lv.Status.ObservedGeneration >= lv.Generation && lv.Status.ErrorCode != "" {
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "expansion of "+id)
			}
			return false, nil
		})
	if err != nil {
		return 0, err
	}
	return lv.Status.CapacityBytes.Value(), nil
}

func (b *ControllerBackend) waitSnapshot(ctx context.Context, id string) (*contract.Snapshot, error) {
	ls := &v1.LocalSnapshot{}
	err := b.waitFor(ctx, &v1.LocalSnapshot{}, func() client.ObjectList { return &v1.LocalSnapshotList{} }, id,
		func(o client.Object) (bool, error) {
			ls = o.(*v1.LocalSnapshot)
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
