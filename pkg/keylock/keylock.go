// Package keylock is localdir's per-key try-lock: pkg/volume's Store locks a
// volume's id for every node and data operation on it, whoever calls; the
// CSI Controller service locks CO-level names and ids with sets of its own.
package keylock

import (
	"context"
	"fmt"
	"sync"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Set is a set of try-locks by key. A busy key fails with contract.ErrBusy
// (ABORTED) instead of queueing, so a CO retry never runs twice at once; keys
// never wait on each other.
type Set struct {
	mu   sync.Mutex
	busy map[string]struct{}
	// released is closed and replaced at every release: what Wait listens to
	// (a sync.Cond cannot be waited on with a context).
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

// Acquire takes every key or none; what names the kind of key in the error.
// It returns the release func, or an error wrapping contract.ErrBusy.
func (s *Set) Acquire(what string, keys ...string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	release, _, err := s.take(what, keys)
	return release, err
}

// Wait is Acquire that waits (bounded by ctx, then Acquire's error) for busy
// keys instead of failing at once: for short, idempotent calls the CO must be
// able to finish, such as NodeUnpublishVolume.
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
