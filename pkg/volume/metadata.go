package volume

import (
	"fmt"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Ranges calls yield with the block ranges of snapshot targetID from start
// that hold data (baseID "") or that may differ from snapshot baseID (an
// earlier or later snapshot of the same volume): engine.AllocatedRanges and
// engine.ChangedRanges on their images, both held against deletion
// meanwhile. Errors: contract.ErrNotFound, contract.ErrPrecondition (a
// directory snapshot, or snapshots of two volumes: a backup tool falls back
// to a full backup), contract.ErrOutOfRange (start
// past the snapshot's size), contract.ErrBusy (being deleted).
func (sn *Snapshots) Ranges(baseID, targetID string, start int64, yield func(off, n int64) error) error {
	target, release, err := sn.holdImage(targetID)
	if err != nil {
		return err
	}
	defer release()
	if start < 0 || start > target.SizeBytes {
		return fmt.Errorf("%w: starting_offset %d is outside snapshot %s's %d bytes", contract.ErrOutOfRange, start, targetID, target.SizeBytes)
	}
	if baseID == "" {
		return engine.AllocatedRanges(sn.Path(target), start, yield)
	}
	base, releaseBase, err := sn.holdImage(baseID)
	if err != nil {
		return err
	}
	defer releaseBase()
	if base.SourceVolumeID != target.SourceVolumeID {
		return fmt.Errorf("%w: snapshot %s is of volume %s and %s of volume %s: a delta is only between snapshots of one volume",
			contract.ErrPrecondition, baseID, base.SourceVolumeID, targetID, target.SourceVolumeID)
	}
	st, err := engine.ChangedRanges(sn.Path(target), sn.Path(base), start, yield)
	klog.V(4).InfoS("Changed ranges", "base", baseID, "target", targetID, "start", start, "compared", st.Compared, "bytesRead", st.BytesRead)
	return err
}

// holdImage returns image snapshot id, read-held until the returned release.
func (sn *Snapshots) holdImage(id string) (*contract.Snapshot, func(), error) {
	s, err := sn.Get(id)
	if err != nil {
		return nil, nil, err
	}
	if !s.Image() {
		return nil, nil, fmt.Errorf("%w: snapshot %s is of a directory volume, which has no blocks to list", contract.ErrPrecondition, id)
	}
	release, err := sn.m.holds.read(id, "a changed block query")
	if err != nil {
		return nil, nil, err
	}
	return s, release, nil
}
