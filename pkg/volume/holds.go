package volume

import (
	"fmt"
	"sync"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// holdSet keeps what an operation reads (a restore's, clone's or snapshot's
// source, a volume being staged) from being deleted or changed under it, for
// every caller of the Store. Read holds are shared, change holds (delete,
// expand) exclusive; neither waits: a conflict is contract.ErrBusy and the
// CO retries. Without it a restore racing a snapshot delete gave a volume
// with part of its files (case C34).
type holdSet struct {
	mu      sync.Mutex
	readers map[string]int    // id → number of read holds
	changer map[string]string // id → what holds it exclusively
}

func newHolds() *holdSet {
	return &holdSet{readers: map[string]int{}, changer: map[string]string{}}
}

// read takes a shared hold on id for what (e.g. "a restore"); contract.ErrBusy while
// the id is being deleted or changed. The returned func releases it.
func (h *holdSet) read(id, what string) (func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.changer[id]; ok {
		return nil, fmt.Errorf("%w: %s cannot read %s while %s is in progress", contract.ErrBusy, what, id, c)
	}
	h.readers[id]++
	return func() {
		h.mu.Lock()
		if h.readers[id]--; h.readers[id] <= 0 {
			delete(h.readers, id)
		}
		h.mu.Unlock()
	}, nil
}

// change takes the exclusive hold on id for what (e.g. "a delete"); contract.ErrBusy
// while anything else holds it.
func (h *holdSet) change(id, what string) (func(), error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.changer[id]; ok {
		return nil, fmt.Errorf("%w: %s of %s must wait: %s is in progress", contract.ErrBusy, what, id, c)
	}
	if n := h.readers[id]; n > 0 {
		return nil, fmt.Errorf("%w: %s of %s must wait: %d operation(s) reading it (restore, clone, snapshot or stage) are in progress", contract.ErrBusy, what, id, n)
	}
	h.changer[id] = what
	return func() {
		h.mu.Lock()
		delete(h.changer, id)
		h.mu.Unlock()
	}, nil
}
