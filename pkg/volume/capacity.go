package volume

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// CapacityInfo is the capacity of the data root, in bytes.
type CapacityInfo struct {
	// Total is the configured capacity, or the filesystem's size.
	Total int64
	// Allocated is the sum of the sizes of existing volumes.
	Allocated int64
	// Free is the free space of the filesystem (statfs f_bavail).
	Free int64
	// Available is what a new volume may still reserve:
	// min(Total - Allocated, Free - space reserved by creates and
	// expansions still writing), never negative.
	Available int64
}

// Capacity reports the data root's capacity (statfs(2) on the data root).
func (m *Manager) Capacity() (CapacityInfo, error) {
	m.mu.Lock()
	alloc, inflight := m.allocated, m.inflight
	m.mu.Unlock()
	return m.capacityWith(alloc, inflight)
}

func (m *Manager) capacityWith(alloc, inflight int64) (CapacityInfo, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.root, &sfs); err != nil {
		return CapacityInfo{}, fmt.Errorf("statfs %s: %w", m.root, err)
	}
	ci := CapacityInfo{
		Total:     int64(sfs.Blocks) * sfs.Bsize,
		Free:      int64(sfs.Bavail) * sfs.Bsize,
		Allocated: alloc,
	}
	if m.cfg.CapacityBytes > 0 {
		ci.Total = m.cfg.CapacityBytes
	}
	ci.Available = max(min(ci.Total-alloc, ci.Free-inflight), 0)
	return ci, nil
}

// reserve takes n bytes of capacity or fails with contract.ErrNoSpace. The caller
// calls settle(n) once the data is written (or failed), and release(n) if
// the reservation is given up.
func (m *Manager) reserve(n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ci, err := m.capacityWith(m.allocated, m.inflight)
	if err != nil {
		return err
	}
	if n > ci.Available {
		return fmt.Errorf("%w: %d bytes requested, %d available on node data root", contract.ErrNoSpace, n, ci.Available)
	}
	m.allocated += n
	m.inflight += n
	return nil
}

// settle ends the in-flight part of a reservation of n bytes: its data is
// written, so statfs counts it now (or it failed and was removed).
func (m *Manager) settle(n int64) {
	m.mu.Lock()
	m.inflight -= n
	m.mu.Unlock()
}

func (m *Manager) release(n int64) {
	m.mu.Lock()
	m.allocated -= n
	m.mu.Unlock()
}
