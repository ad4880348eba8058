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

// Expand grows volume id to newSize bytes (CSI ControllerExpandVolume): the
// capacity is reserved, the btrfs qgroup limit raised or the image file
// grown (an attached loop device is refreshed by NodeExpand), and the new
// size committed. A newSize at or below the current size changes nothing.
// It returns the volume's capacity afterwards. Errors: contract.ErrNotFound,
// contract.ErrNoSpace, contract.ErrBusy (a snapshot or clone of it, or another change, is in
// progress).
func (m *Store) Expand(id string, newSize int64) (int64, error) {
	unlock, err := m.lock(id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	release, err := m.holds.change(id, "an expansion")
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
	delta := newSize - v.CapacityBytes
	if err := m.acct.reserve(id, delta); err != nil {
		return 0, err
	}
	// The new size is committed before the data grows: a crash between the
	// two leaves a record larger than its data, which NodeExpand (and the
	// next stage) finish, never data larger than its record, which a
	// snapshot or clone of the record's size would cut short.
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

// finishGrowth grows volume v's data to the size of its record when an
// expansion was cut short between the commit of the record and the growth
// (Expand commits first): an image file smaller than the record is grown
// and allocated (attached loop devices refreshed), a btrfs qgroup limit
// below it is raised. It reports whether anything grew. Data at the
// record's size costs one stat(2), or one quota tree lookup, and is left
// alone; missing data too (Health reports it). Errors: the kernel's
// (ENOSPC when the disk cannot hold the image).
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
