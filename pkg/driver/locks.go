package driver

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks is a set of try-locks by key (a CSI name or a volume_id). A call
// that finds its key busy answers ABORTED ("operation pending for volume",
// CSI spec error scheme) instead of queueing, so a CO retry never runs twice
// at once and unrelated keys never wait on each other: there is no lock
// across volumes.
type keyLocks struct {
	mu   sync.Mutex
	busy map[string]struct{}
}

func newKeyLocks() *keyLocks { return &keyLocks{busy: map[string]struct{}{}} }

// acquire takes every key or none; it returns the release func, or ABORTED.
func (l *keyLocks) acquire(what string, keys ...string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		if _, ok := l.busy[k]; ok {
			return nil, status.Errorf(codes.Aborted, "an operation on %s %q is already in progress", what, k)
		}
	}
	for _, k := range keys {
		l.busy[k] = struct{}{}
	}
	return func() {
		l.mu.Lock()
		for _, k := range keys {
			delete(l.busy, k)
		}
		l.mu.Unlock()
	}, nil
}

// wait is acquire that waits (polling, bounded by ctx) for a busy key
// instead of failing at once. Only for calls that are short and idempotent
// and that the CO must be able to finish, such as NodeUnpublishVolume.
func (l *keyLocks) wait(ctx context.Context, what string, keys ...string) (func(), error) {
	for {
		release, err := l.acquire(what, keys...)
		if err == nil {
			return release, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(2 * time.Millisecond):
		}
	}
}
