package volume

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

// useRefresh is how old the measured use of the volumes may get before
// Capacity measures it again (in the background).
const useRefresh = 30 * time.Second

// volUse is a volume's size and its use when last measured (0 until then, so
// its whole size is held back from the free space).
type volUse struct{ size, used int64 }

// accounting is the capacity accounting of a Store: what volumes reserve
// and use (Store.use, under Store.mu).
type accounting struct{ *Store }

// Capacity reports the data root's capacity, never more than every volume can
// still be filled to its size alongside a new one, and re-measures the
// volumes' use in the background when the last measure is older than useRefresh.
func (m *Store) Capacity() (contract.CapacityInfo, error) {
	m.mu.Lock()
	ci, err := m.acct.capacityLocked()
	stale := !m.measuring && time.Since(m.measuredAt) > useRefresh
	if stale {
		m.measuring = true
	}
	m.mu.Unlock()
	if stale {
		go m.acct.measureUse()
	}
	return ci, err
}

func (m accounting) capacityLocked() (contract.CapacityInfo, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.root, &sfs); err != nil {
		return contract.CapacityInfo{}, fmt.Errorf("statfs %s: %w", m.root, err)
	}
	ci := contract.CapacityInfo{
		Total: int64(sfs.Blocks) * sfs.Bsize,
		Free:  int64(sfs.Bavail) * sfs.Bsize,
	}
	if m.cfg.CapacityBytes > 0 {
		ci.Total = m.cfg.CapacityBytes
	}
	for _, u := range m.use {
		ci.Allocated += u.size
		ci.Headroom += max(u.size-u.used, 0)
	}
	ci.Available = max(min(ci.Total-ci.Allocated, ci.Free-ci.Headroom), 0)
	return ci, nil
}

// reserve takes n bytes of capacity for volume id (new, or a growth) or fails
// with contract.ErrNoSpace; they count as free space the volume may fill until
// measured. unreserve gives them back.
func (m accounting) reserve(id string, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ci, err := m.capacityLocked()
	if err != nil {
		return err
	}
	if n > ci.Available {
		return fmt.Errorf("%w: %d bytes requested, %d available on node data root", contract.ErrNoSpace, n, ci.Available)
	}
	u := m.use[id]
	u.size += n
	m.use[id] = u
	return nil
}

// unreserve gives back n bytes reserved for id; a volume left with no size
// (a failed create, or a deleted volume when n is its size) is forgotten.
func (m accounting) unreserve(id string, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := m.use[id]
	u.size -= n
	if u.size <= 0 {
		delete(m.use, id)
		return
	}
	m.use[id] = u
}

// measured records the bytes volume v uses now (after its data was
// written); a failed measurement keeps the last one.
func (m accounting) measured(v *contract.Volume) {
	used, err := m.usedBytes(v)
	if err != nil {
		klog.V(4).InfoS("Could not measure a volume's use; capacity keeps its last figure", "volumeID", v.ID, "err", err)
		return
	}
	m.mu.Lock()
	if u, ok := m.use[v.ID]; ok {
		u.used = used
		m.use[v.ID] = u
	}
	m.mu.Unlock()
}

// usedBytes is the disk space v's data holds on its own: an image's
// allocated blocks, else the engine's Exclusive bytes.
func (m accounting) usedBytes(v *contract.Volume) (int64, error) {
	if v.Image() {
		var st unix.Stat_t
		if err := unix.Lstat(m.imagePath(v.ID), &st); err != nil {
			return 0, err
		}
		return st.Blocks * 512, nil
	}
	return m.eng.Exclusive(m.volDir(v.ID))
}

// measureUse measures every recorded volume's use (outside m.mu); one runs at
// a time (m.measuring).
func (m accounting) measureUse() {
	defer func() {
		m.mu.Lock()
		m.measuring, m.measuredAt = false, time.Now()
		m.mu.Unlock()
	}()
	var vols []*contract.Volume
	if err := m.st.View(func(tx *state.Tx) error {
		return tx.ForEachVolume("", func(v *contract.Volume) bool { vols = append(vols, v); return true })
	}); err != nil {
		klog.V(4).InfoS("Could not list volumes to measure their use", "err", err)
		return
	}
	for _, v := range vols {
		if _, err := os.Lstat(m.dataPath(v)); err == nil {
			m.measured(v)
		}
	}
}
