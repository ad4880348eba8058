package volume

import (
	"errors"
	"fmt"
	"os"
	"time"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Snapshots is the snapshot side of a Store (Store.Snapshots): snapshots
// and volume group snapshots of its volumes, under the same records,
// per-volume lock and holds.
type Snapshots struct{ m *Store }

// Path is where snapshot s's data lives on this node.
func (sn *Snapshots) Path(s *contract.Snapshot) string { return sn.m.snapPath(s) }

// LookupByName returns the snapshot created for a CSI name, or nil.
func (sn *Snapshots) LookupByName(name string) (*contract.Snapshot, error) {
	m := sn.m
	var s *contract.Snapshot
	err := m.st.View(func(tx *state.Tx) error {
		id := tx.SnapshotIDByName(name)
		if id == "" {
			return nil
		}
		var err error
		s, err = tx.Snapshot(id)
		return err
	})
	return s, err
}

// Get returns the snapshot with this id. Errors: contract.ErrNotFound (also
// for ids not of the driver's shape).
func (sn *Snapshots) Get(id string) (*contract.Snapshot, error) {
	m := sn.m
	if !contract.ValidSnapshotID(id) {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	var s *contract.Snapshot
	err := m.st.View(func(tx *state.Tx) error {
		var err error
		s, err = tx.Snapshot(id)
		return err
	})
	if err == nil && s == nil {
		err = fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	return s, err
}

// Create takes a snapshot of volume spec.SourceVolumeID for the CSI
// name and commits its record before it returns. btrfs volumes get a
// read-only subvolume snapshot (O(1)); dir volumes a CopyTree copy (extents
// shared on reflink filesystems); block volumes a copy of the image. The
// source is held for the whole copy (deleting or expanding it meanwhile
// fails with contract.ErrBusy), and the data is written under a .creating- name
// that becomes final after the record is committed (see Create). The
// snapshot is independent of its source: deleting the volume leaves it
// usable. Its size is the source's capacity (the restore size). Errors:
// contract.ErrNotFound (source), contract.ErrNoSpace, contract.ErrExists (name taken by a concurrent
// call), contract.ErrBusy.
func (sn *Snapshots) Create(spec contract.SnapshotSpec) (*contract.Snapshot, error) {
	m := sn.m
	name := spec.Name
	given := spec.ID != ""
	if !given {
		spec.ID = contract.NewSnapshotID()
	} else if !contract.ValidSnapshotID(spec.ID) {
		return nil, fmt.Errorf("%w: snapshot id %q", contract.ErrInvalid, spec.ID)
	}
	unlock, err := m.lock(spec.ID, spec.SourceVolumeID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	release, err := m.holds.change(spec.ID, "a snapshot")
	if err != nil {
		return nil, err
	}
	defer release()
	if given { // the node already holds it: the reconciler's idempotency
		if s, err := sn.Get(spec.ID); err == nil {
			return s, nil
		}
	}
	releaseSrc, err := m.holds.read(spec.SourceVolumeID, "a snapshot")
	if err != nil {
		return nil, err
	}
	defer releaseSrc()
	v, err := m.Get(spec.SourceVolumeID)
	if err != nil {
		return nil, err
	}
	s := &contract.Snapshot{
		ID:             spec.ID,
		Name:           name,
		SourceVolumeID: v.ID,
		SizeBytes:      v.CapacityBytes,
		AccessType:     v.AccessType,
		FsType:         v.FsType,
		Engine:         v.Engine,
		CreatedAt:      time.Now().UTC(),
	}
	if err := m.land(landing{
		what:  "snapshot",
		dsts:  []string{m.snapPath(s)},
		write: func(tmps []string) error { return sn.writeSnapshot(v, tmps[0]) },
		commit: func(tx *state.Tx) error {
			if tx.SnapshotIDByName(name) != "" {
				return fmt.Errorf("%w: snapshot name %q", contract.ErrExists, name)
			}
			return tx.PutSnapshot(s)
		},
		uncommit: func(tx *state.Tx) error { return tx.DeleteSnapshot(s.ID) },
	}); err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Snapshot created", "snapshotID", s.ID, "sourceVolumeID", v.ID, "size", s.SizeBytes)
	return s, nil
}

// writeSnapshot writes the snapshot of volume v at tmp (cutSnapshot, an
// image frozen while it is copied when it is staged) and syncs it to disk,
// before the record that acknowledges it is committed.
func (sn *Snapshots) writeSnapshot(v *contract.Volume, tmp string) error {
	if err := sn.cutSnapshot(v, tmp, sn.snapshotImage); err != nil {
		return err
	}
	if err := syncFS(tmp); err != nil {
		return fmt.Errorf("snapshot volume %s: %w", v.ID, err)
	}
	return nil
}

// cutSnapshot writes the snapshot data of volume v at tmp, unsynced,
// removing what a failed earlier attempt left there first: an image with
// copyImage (snapshotImage freezes a staged one; copyImage, for a caller
// that froze it, does not), else the engine's snapshot of its tree.
func (sn *Snapshots) cutSnapshot(v *contract.Volume, tmp string, copyImage func(*contract.Volume, string) error) error {
	m := sn.m
	if err := engine.Remove(tmp); err != nil {
		return err
	}
	var err error
	if v.Image() {
		err = copyImage(v, tmp)
	} else {
		err = m.eng.Snapshot(m.volDir(v.ID), tmp)
	}
	if err != nil {
		return fmt.Errorf("snapshot volume %s: %w", v.ID, err)
	}
	return nil
}

// Delete removes a snapshot (record first, then data). Unknown ids
// succeed. Volumes restored from it are independent and stay. Errors:
// contract.ErrBusy while a restore reads it (case C34).
func (sn *Snapshots) Delete(id string) error {
	m := sn.m
	if !contract.ValidSnapshotID(id) {
		return nil
	}
	unlock, err := m.lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	release, err := m.holds.change(id, "a delete")
	if err != nil {
		return err
	}
	defer release()
	s, err := sn.Get(id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	t, err := m.trash(m.snapPath(s))
	if err != nil {
		return err
	}
	if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteSnapshot(id) }); err != nil {
		_ = os.Rename(t, m.snapPath(s))
		return err
	}
	if err := engine.Remove(t); err != nil {
		klog.ErrorS(err, "Snapshot record deleted but data removal failed; it will be retried at restart", "snapshotID", id)
	}
	klog.V(2).InfoS("Snapshot deleted", "snapshotID", id)
	return nil
}

// List returns up to limit snapshots (all when limit <= 0) whose
// ids sort after `after`, optionally only those of one source volume, in id
// order, and the id to continue after ("" at the end).
func (sn *Snapshots) List(after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error) {
	m := sn.m
	var out []*contract.Snapshot
	next := ""
	err := m.st.View(func(tx *state.Tx) error {
		return tx.ForEachSnapshot(after, func(s *contract.Snapshot) bool {
			if sourceVolumeID != "" && s.SourceVolumeID != sourceVolumeID {
				return true
			}
			if limit > 0 && len(out) == limit {
				next = out[len(out)-1].ID
				return false
			}
			out = append(out, s)
			return true
		})
	})
	return out, next, err
}

// snapshotImage copies the image of volume v to tmp: a reflink where the
// data root's filesystem can (O(1)), else a sparse-aware copy, with its
// filesystem frozen when it is staged (whileFrozen).
func (sn *Snapshots) snapshotImage(v *contract.Volume, tmp string) error {
	m := sn.m
	return m.whileFrozen(v, func() error { return sn.copyImage(v, tmp) })
}

// copyImage copies image volume v's image to tmp as it is (the caller
// froze it if it is staged).
func (sn *Snapshots) copyImage(v *contract.Volume, tmp string) error {
	m := sn.m
	return writeImage(tmp, m.imagePath(v.ID), v.CapacityBytes)
}

// whileFrozen runs copy, a copy of volume v's image, with v's filesystem
// frozen where it is staged (Node.Freeze) when v is an image volume with a
// filesystem, so the copy holds everything written before the call; a raw
// block volume is copied as it is (crash-consistent only if nothing
// writes). A thaw that fails, or came by timeout, fails the copy: it is not
// consistent.
func (m *Store) whileFrozen(v *contract.Volume, copy func() error) error {
	thaw := func() error { return nil }
	if v.FsType != "" {
		var err error
		if thaw, err = m.node.Freeze(v); err != nil {
			return err
		}
	}
	err := copy()
	if terr := thaw(); err == nil {
		err = terr
	}
	return err
}
