package driver

import (
	"context"
	"sync"

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
	// released is closed (and replaced) whenever keys are released: the
	// broadcast wait listens to instead of polling.
	released chan struct{}
}

func newKeyLocks() *keyLocks {
	return &keyLocks{busy: map[string]struct{}{}, released: make(chan struct{})}
}

// take takes every key or none, with l.mu held; it returns the release
// func, or ABORTED and the channel closed at the next release.
func (l *keyLocks) take(what string, keys []string) (func(), <-chan struct{}, error) {
	for _, k := range keys {
		if _, ok := l.busy[k]; ok {
			return nil, l.released, status.Errorf(codes.Aborted, "an operation on %s %q is already in progress", what, k)
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
		close(l.released)
		l.released = make(chan struct{})
		l.mu.Unlock()
	}, nil, nil
}

// acquire takes every key or none; it returns the release func, or ABORTED.
func (l *keyLocks) acquire(what string, keys ...string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	release, _, err := l.take(what, keys)
	return release, err
}

// wait is acquire that waits (bounded by ctx) for busy keys instead of
// failing at once; it tries again at every release. Only for calls that are
// short and idempotent and that the CO must be able to finish, such as
// NodeUnpublishVolume.
func (l *keyLocks) wait(ctx context.Context, what string, keys ...string) (func(), error) {
	for {
		l.mu.Lock()
		release, released, err := l.take(what, keys)
		l.mu.Unlock()
		if err == nil {
			return release, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-released:
		}
	}
}
