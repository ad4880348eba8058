package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

// Expand grows volume id to newSize (CSI ControllerExpandVolume): reserves,
// commits the size, then grows the data; a smaller newSize changes nothing.
// It returns the capacity. Errors: contract.ErrNotFound, contract.ErrNoSpace,
// contract.ErrOutOfRange (newSize above the data root's capacity),
// contract.ErrBusy.
func (m *Store) Expand(id string, newSize int64) (int64, error) {
	release, err := m.lockChange("an expansion", id)
	if err != nil {
		return 0, err
	}
	defer release()
	v, err := m.Get(id)
	if err != nil {
		return 0, err
	}
	if newSize <= v.CapacityBytes {
		// A retry of an expansion a crash cut short after its record
		// (start-up recovery finishes those too, see finishGrowth).
		if _, err := m.finishGrowth(v); err != nil {
			return 0, mapNoSpace(err)
		}
		return v.CapacityBytes, nil
	}
	// Larger than the whole data root: no retry can succeed (OUT_OF_RANGE,
	// which Kubernetes marks infeasible so the user may ask for less);
	// short of room now is RESOURCE_EXHAUSTED, retried.
	if ci, err := m.Capacity(); err == nil && newSize > ci.Total {
		return 0, fmt.Errorf("%w: volume %s cannot grow to %d bytes on this node: its data root holds %d bytes in all (%d more available now)",
			contract.ErrOutOfRange, id, newSize, ci.Total, ci.Available)
	}
	delta := newSize - v.CapacityBytes
	if err := m.acct.reserve(id, delta); err != nil {
		return 0, err
	}
	// The size is committed before the data grows: a crash between leaves a
	// record larger than its data, which NodeExpand and the next stage finish,
	// never data larger than its record, which a snapshot would cut short.
	old := v.CapacityBytes
	v.CapacityBytes = newSize
	if err := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(v) }); err != nil {
		m.acct.unreserve(id, delta)
		return 0, err
	}
	if err := m.resizeData(v, newSize); err != nil {
		v.CapacityBytes = old
		if rerr := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(v) }); rerr != nil {
			// The reservation stays with the larger record.
			return 0, fmt.Errorf("%w; and the record could not be set back to %d bytes (%v): NodeExpandVolume finishes the growth", mapNoSpace(err), old, rerr)
		}
		m.acct.unreserve(id, delta)
		return 0, mapNoSpace(err)
	}
	m.acct.measured(v)
	klog.V(2).InfoS("Volume expanded", "volumeID", id, "size", newSize)
	return newSize, nil
}

func (m *Store) resizeData(v *contract.Volume, size int64) error {
	if v.Image() {
		img := m.imagePath(v.ID)
		fi, err := os.Stat(img)
		if err != nil {
			return err
		}
		if size > fi.Size() { // never shrink: an image only grows
			if err := preallocate(img, size); err != nil {
				_ = unix.Truncate(img, fi.Size()) // give back what was allocated past the old size
				return err
			}
		}
		return m.node.Refresh(img)
	}
	return m.eng.Resize(m.volDir(v.ID), size)
}

// finishGrowth grows v's data to its record's size after an expansion cut
// short between commit and growth, and reports whether anything grew; data
// at its size costs one stat(2) or quota lookup, missing data is left alone.
func (m *Store) finishGrowth(v *contract.Volume) (bool, error) {
	var size int64
	var err error
	switch {
	case v.Image():
		var fi os.FileInfo
		if fi, err = os.Stat(m.imagePath(v.ID)); err == nil {
			size = fi.Size()
		}
	case m.eng.Enforced() && v.Engine == m.eng.Name():
		size, err = m.eng.Limit(m.volDir(v.ID))
	default:
		return false, nil
	}
	if errors.Is(err, fs.ErrNotExist) || err == nil && size >= v.CapacityBytes {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, m.resizeData(v, v.CapacityBytes)
}
