// Package keylock is the one per-key try-lock of localdir: pkg/volume.Manager
// locks a volume_id (or an ephemeral volume's CO id) for every node and data
// operation on it, whoever calls (the CSI Node service, the controller's
// backend in all mode, the cluster node agent's reconcilers); the CSI
// Controller service locks CO-level names and ids with a set of its own
// (controller mode has no Manager).
package keylock

import (
	"context"
	"fmt"
	"sync"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Set is a set of try-locks by key (a CSI name or a volume_id). A call that
// finds its key busy fails with contract.ErrBusy (gRPC ABORTED, "operation
// pending for volume", CSI spec error scheme) instead of queueing, so a CO
// retry never runs twice at once and unrelated keys never wait on each
// other: there is no lock across keys.
type Set struct {
	mu   sync.Mutex
	busy map[string]struct{}
	// released is closed (and replaced) whenever keys are released: the
	// broadcast Wait listens to instead of polling (a sync.Cond cannot be
	// waited on together with a context).
	released chan struct{}
}

// New returns an empty Set.
func New() *Set {
	return &Set{busy: map[string]struct{}{}, released: make(chan struct{})}
}

// take takes every key or none, with s.mu held; it returns the release
// func, or contract.ErrBusy and the channel closed at the next release.
func (s *Set) take(what string, keys []string) (func(), <-chan struct{}, error) {
	for _, k := range keys {
		if _, ok := s.busy[k]; ok {
			return nil, s.released, fmt.Errorf("%w: an operation on %s %q is already in progress", contract.ErrBusy, what, k)
		}
	}
	for _, k := range keys {
		s.busy[k] = struct{}{}
	}
	return func() {
		s.mu.Lock()
		for _, k := range keys {
			delete(s.busy, k)
		}
		close(s.released)
		s.released = make(chan struct{})
		s.mu.Unlock()
	}, nil, nil
}

// Acquire takes every key or none; what names the kind of key in the error
// ("volume", "volume name"). It returns the release func, or an error
// wrapping contract.ErrBusy.
func (s *Set) Acquire(what string, keys ...string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	release, _, err := s.take(what, keys)
	return release, err
}

// Wait is Acquire that waits (bounded by ctx) for busy keys instead of
// failing at once; it tries again at every release and, when ctx ends
// first, returns Acquire's contract.ErrBusy error. Only for calls that are
// short and idempotent and that the CO must be able to finish, such as
// NodeUnpublishVolume.
func (s *Set) Wait(ctx context.Context, what string, keys ...string) (func(), error) {
	for {
		s.mu.Lock()
		release, released, err := s.take(what, keys)
		s.mu.Unlock()
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
