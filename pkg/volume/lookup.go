package volume

import (
	"fmt"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

// LookupByName returns the volume created for a CSI name, or nil.
func (m *Store) LookupByName(name string) (*contract.Volume, error) {
	var v *contract.Volume
	err := m.st.View(func(tx *state.Tx) error {
		id := tx.VolumeIDByName(name)
		if id == "" {
			return nil
		}
		var err error
		v, err = tx.Volume(id)
		return err
	})
	return v, err
}

// Get returns the volume with this id. Errors: contract.ErrNotFound (also for any id
// that is not of the driver's shape).
func (m *Store) Get(id string) (*contract.Volume, error) {
	if !contract.ValidVolumeID(id) {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	var v *contract.Volume
	err := m.st.View(func(tx *state.Tx) error {
		var err error
		v, err = tx.Volume(id)
		return err
	})
	if err == nil && v == nil {
		err = fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return v, err
}

// Resolve returns the volume a node call names: a driver-issued volume_id,
// or the CO-chosen id of an ephemeral inline volume. Errors: contract.ErrNotFound.
func (m *Store) Resolve(id string) (*contract.Volume, error) {
	if contract.ValidVolumeID(id) {
		return m.Get(id)
	}
	v, err := m.LookupByName(contract.EphemeralName(id))
	if err == nil && v == nil {
		err = fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return v, err
}

// List returns up to limit volumes (all when limit <= 0) after `after` in id
// order and the id to continue after; ephemeral volumes are not listed.
func (m *Store) List(after string, limit int) ([]*contract.Volume, string, error) {
	var out []*contract.Volume
	next := ""
	err := m.st.View(func(tx *state.Tx) error {
		return tx.ForEachVolume(after, func(v *contract.Volume) bool {
			if v.Ephemeral {
				return true
			}
			if limit > 0 && len(out) == limit {
				next = out[len(out)-1].ID
				return false
			}
			out = append(out, v)
			return true
		})
	})
	return out, next, err
}
