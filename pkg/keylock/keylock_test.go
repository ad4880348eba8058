package keylock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// wantCode checks the gRPC code contract.ToStatus gives err (OK for nil).
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	got := codes.OK
	if err != nil {
		got = contract.Code(err)
	}
	if got != want {
		t.Fatalf("got %v (%v), want %v", got, err, want)
	}
}

func TestKeyLocks(t *testing.T) {
	l := New()

	relA, err := l.Acquire("volume", "a")
	wantCode(t, err, codes.OK)

	// A held key: ABORTED naming it, nothing returned.
	rel, err := l.Acquire("volume", "a")
	wantCode(t, err, codes.Aborted)
	if rel != nil {
		t.Fatal("release func returned with an error")
	}
	if msg := err.Error(); !strings.Contains(msg, `volume "a"`) {
		t.Fatalf("message %q does not name the key", msg)
	}

	// Unrelated keys do not wait.
	relB, err := l.Acquire("volume", "b")
	wantCode(t, err, codes.OK)

	// All or nothing: "c" must not stay taken when "a" is busy.
	_, err = l.Acquire("volume", "c", "a")
	wantCode(t, err, codes.Aborted)
	_, err = l.Acquire("volume", "c", "d", "b")
	wantCode(t, err, codes.Aborted)
	if len(l.busy) != 2 {
		t.Fatalf("busy = %v after failed multi-key acquires, want only a and b", l.busy)
	}
	relC, err := l.Acquire("volume", "c", "d")
	wantCode(t, err, codes.OK)
	_, err = l.Acquire("volume", "d")
	wantCode(t, err, codes.Aborted)

	// Release frees exactly its own keys.
	relA()
	relA2, err := l.Acquire("volume", "a")
	wantCode(t, err, codes.OK)
	_, err = l.Acquire("volume", "b")
	wantCode(t, err, codes.Aborted)
	relC()
	for _, k := range []string{"c", "d"} {
		r, err := l.Acquire("volume", k)
		wantCode(t, err, codes.OK)
		r()
	}
	relB()
	relA2()
	if len(l.busy) != 0 {
		t.Fatalf("busy = %v after releasing everything", l.busy)
	}

	// No keys: always succeeds.
	r, err := l.Acquire("volume")
	wantCode(t, err, codes.OK)
	r()

	// The same key twice in one call is taken once and freed.
	r, err = l.Acquire("volume", "e", "e")
	wantCode(t, err, codes.OK)
	r()
	if len(l.busy) != 0 {
		t.Fatalf("busy = %v", l.busy)
	}
}

func TestKeyLocksConcurrent(t *testing.T) {
	l := New()
	const workers, rounds = 16, 500
	var inside [4]atomic.Int32
	var wins, aborts atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				k := (w + i) % len(inside)
				rel, err := l.Acquire("volume", fmt.Sprint(k))
				if err != nil {
					if !errors.Is(err, contract.ErrBusy) {
						t.Errorf("unexpected error %v", err)
					}
					aborts.Add(1)
					continue
				}
				if n := inside[k].Add(1); n != 1 {
					t.Errorf("%d holders of key %d", n, k)
				}
				inside[k].Add(-1)
				rel()
				wins.Add(1)
			}
		}(w)
	}
	wg.Wait()
	if wins.Load()+aborts.Load() != workers*rounds || wins.Load() == 0 {
		t.Fatalf("wins=%d aborts=%d", wins.Load(), aborts.Load())
	}
	if len(l.busy) != 0 {
		t.Fatalf("busy = %v after all released", l.busy)
	}
}

func TestKeyLocksWait(t *testing.T) {
	l := New()
	rel, err := l.Wait(context.Background(), "volume", "a")
	wantCode(t, err, codes.OK)

	// A busy key: wait gives up with ABORTED when its context ends.
	start := time.Now() // before the deadline is set, so it cannot look early
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	r, err := l.Wait(ctx, "volume", "a", "b")
	wantCode(t, err, codes.Aborted)
	if r != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("wait returned early (%v) or with a release func", time.Since(start))
	}
	if _, held := l.busy["b"]; held {
		t.Fatal("wait left key b taken after giving up")
	}

	// It takes the key as soon as it is released.
	got := make(chan error, 1)
	go func() {
		r, err := l.Wait(context.Background(), "volume", "a")
		if err == nil {
			r()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("wait returned while the key was held: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	rel()
	select {
	case err := <-got:
		wantCode(t, err, codes.OK)
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not take the released key")
	}
	if len(l.busy) != 0 {
		t.Fatalf("busy = %v", l.busy)
	}
}
