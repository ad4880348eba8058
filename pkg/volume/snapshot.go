package volume

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Snapshots is a Store's snapshot side (Store.Snapshots), under its records,
// locks and holds.
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

// Create snapshots volume spec.SourceVolumeID for the CSI name and commits
// the record before it returns (landing): a read-only btrfs subvolume
// snapshot, a CopyTree copy (dir engine), or an image copy; the source is held
// meanwhile. The snapshot outlives its source; its size is the source's.
// Errors: contract.ErrNotFound, contract.ErrNoSpace, contract.ErrExists (name
// taken by a concurrent call), contract.ErrBusy.
func (sn *Snapshots) Create(spec contract.SnapshotSpec) (*contract.Snapshot, error) {
	m := sn.m
	name := spec.Name
	given := spec.ID != ""
	if !given {
		spec.ID = contract.NewSnapshotID()
	} else if !contract.ValidSnapshotID(spec.ID) {
		return nil, fmt.Errorf("%w: snapshot id %q", contract.ErrInvalid, spec.ID)
	}
	release, err := m.lockChange("a snapshot", spec.ID, spec.SourceVolumeID)
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
		KeySalt:        v.KeySalt,
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

// writeSnapshot writes v's snapshot at tmp and syncs it before the record
// acknowledging it is committed.
func (sn *Snapshots) writeSnapshot(v *contract.Volume, tmp string) error {
	if err := sn.cutSnapshot(v, tmp, sn.snapshotImage); err != nil {
		return err
	}
	if err := syncFS(tmp); err != nil {
		return fmt.Errorf("snapshot volume %s: %w", v.ID, err)
	}
	return nil
}

// cutSnapshot writes v's snapshot data at tmp, unsynced, over what a failed
// attempt left: an image with copyImage, else the engine's snapshot.
func (sn *Snapshots) cutSnapshot(v *contract.Volume, tmp string, copyImage func(*contract.Volume, string) error) error {
	m := sn.m
	if err := engine.Remove(tmp); err != nil {
		return err
	}
	var err error
	switch {
	case v.Image():
		err = copyImage(v, tmp)
	case v.EncryptedDir():
		if err = filled(v); err == nil {
			err = m.copyEncrypted("volume "+v.ID, m.volDir(v.ID), tmp, false)
		}
	default:
		err = m.eng.Snapshot(m.volDir(v.ID), tmp)
	}
	if err != nil {
		return fmt.Errorf("snapshot volume %s: %w", v.ID, err)
	}
	return nil
}

// Delete removes a snapshot (record first, then data); unknown ids succeed.
// Errors: contract.ErrBusy while a restore reads it (case C34);
// contract.ErrPrecondition while a restore waits to be filled from it at
// its first stage (contract.Volume.FillFrom).
func (sn *Snapshots) Delete(id string) error {
	m := sn.m
	if !contract.ValidSnapshotID(id) {
		return nil
	}
	release, err := m.lockChange("a delete", id)
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
	if vid, err := m.fillingFrom(id); err != nil || vid != "" {
		if err == nil {
			err = fmt.Errorf("%w: snapshot %s is in use: encrypted volume %s, restored from it while its key was not on the node, is filled from it at its first stage; delete the snapshot after a pod has used that volume, or delete the volume", contract.ErrPrecondition, id, vid)
		}
		return err
	}
	if err := m.unland("snapshot", id, m.snapPath(s), func(tx *state.Tx) error { return tx.DeleteSnapshot(id) }); err != nil {
		return err
	}
	klog.V(2).InfoS("Snapshot deleted", "snapshotID", id)
	return nil
}

// List returns up to limit snapshots (all when limit <= 0) after `after` in
// id order, optionally of one source volume, and the id to continue after.
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

// snapshotImage copies v's image to tmp (a reflink where possible), frozen
// while copied when staged (whileFrozen).
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

// whileFrozen runs copy with image volume v's filesystem frozen where staged
// (Node.Freeze); a raw block volume is copied as is, consistent only if
// nothing writes. A failed or timed-out thaw fails the copy.
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
