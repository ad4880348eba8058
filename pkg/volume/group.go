package volume

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/block"
	"github.com/localdir-csi/localdir/pkg/volume/cgroup"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Volume group snapshots (CSI GroupController, CREATE_DELETE_GET_VOLUME_
// GROUP_SNAPSHOT). A group is its member snapshots: ordinary snapshots
// whose records carry the group's id (and a name of their own that no CSI
// name can take), committed in one transaction. The spec asks for
// write-order consistency across the members, or a failure: the members
// are cut while nothing can write to any of them. A staged image volume
// (ext4, xfs) is frozen (FIFREEZE) for the copy, all members together; a
// volume nobody uses (not staged, not published, no loop device attached)
// has no writer. A directory volume or raw block volume in use cannot be
// frozen as a filesystem (btrfs snapshots cannot be cut while their
// filesystem is frozen, and each is its own transaction): the pods that
// use it are frozen instead (their freezer cgroup, pods.go). One used
// otherwise than by a known pod is refused with FAILED_PRECONDITION.

// memberName is the record name of group gid's snapshot of volume volID:
// it starts with a NUL byte, which no CSI name may contain.
func memberName(gid, volID string) string { return "\x00group/" + gid + "/" + volID }

// CreateGroupSnapshot cuts one snapshot of each of the volumes
// sourceIDs at one point in time for the CSI name, and commits their
// records in one transaction. Members that are staged image volumes are
// frozen together while their images are copied (milliseconds on a data
// root with reflinks: btrfs, XFS reflink; a full copy elsewhere) and thawed
// before anything else; the copies are synced after the thaw. A retry with
// the same name and volumes returns the group. Errors: contract.ErrInvalid
// (no volume, a volume twice), contract.ErrNotFound (a volume),
// contract.ErrExists (the name holds a group of other volumes),
// contract.ErrPrecondition (a directory or raw block volume in use),
// contract.ErrBusy (a change of a member or of the group is running),
// contract.ErrNoSpace. Nothing is left behind on failure.
func (m *Manager) CreateGroupSnapshot(name string, sourceIDs []string) (*contract.GroupSnapshot, error) {
	return m.CreateGroupSnapshotWithIDs(name, sourceIDs, nil)
}

// CreateGroupSnapshotWithIDs is CreateGroupSnapshot with the member
// snapshot ids chosen by the caller (the cluster controller):
// snapshotIDs[i] is the snapshot of sourceIDs[i]; nil for fresh ones.
// Errors as CreateGroupSnapshot, and contract.ErrInvalid for ids of the
// wrong shape or number.
func (m *Manager) CreateGroupSnapshotWithIDs(name string, sourceIDs, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	gid := contract.GroupSnapshotIDFor(name)
	if len(sourceIDs) == 0 {
		return nil, fmt.Errorf("%w: a group snapshot needs source volumes", contract.ErrInvalid)
	}
	if snapshotIDs != nil && len(snapshotIDs) != len(sourceIDs) {
		return nil, fmt.Errorf("%w: %d snapshot ids for %d volumes", contract.ErrInvalid, len(snapshotIDs), len(sourceIDs))
	}
	memberID := map[string]string{}
	for i, id := range sourceIDs {
		if snapshotIDs == nil {
			memberID[id] = contract.NewSnapshotID()
		} else if memberID[id] = snapshotIDs[i]; !contract.ValidSnapshotID(snapshotIDs[i]) {
			return nil, fmt.Errorf("%w: snapshot id %q", contract.ErrInvalid, snapshotIDs[i])
		}
	}
	ids := slices.Clone(sourceIDs)
	slices.Sort(ids)
	if c := slices.Compact(slices.Clone(ids)); len(c) != len(ids) {
		return nil, fmt.Errorf("%w: a source volume is named twice", contract.ErrInvalid)
	}
	unlock, err := m.lock(append([]string{gid}, ids...)...)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if g, err := m.GetGroupSnapshot(gid, nil); err == nil {
		var have []string
		for _, s := range g.Snapshots {
			have = append(have, s.SourceVolumeID)
		}
		if !slices.Equal(have, ids) {
			return nil, fmt.Errorf("%w: group snapshot %q exists of volumes %s", contract.ErrExists, name, strings.Join(have, ", "))
		}
		return g, nil
	} else if !errors.Is(err, contract.ErrNotFound) {
		return nil, err
	}
	var vols []*contract.Volume
	var pods []string // the pods that use members, to freeze
	for _, id := range ids {
		release, err := m.holds.read(id, "a group snapshot")
		if err != nil {
			return nil, err
		}
		defer release()
		v, err := m.Get(id)
		if err != nil {
			return nil, err
		}
		uids, why, err := m.podWriters(v)
		if err != nil {
			return nil, err
		} else if why != "" {
			return nil, fmt.Errorf("%w: volume %s %s: localdir cannot stop its writes for a consistent group snapshot; take it out of the group or stop what uses it", contract.ErrPrecondition, id, why)
		}
		for _, u := range uids {
			if !slices.Contains(pods, u) {
				pods = append(pods, u)
			}
		}
		vols = append(vols, v)
	}

	now := time.Now().UTC()
	g := &contract.GroupSnapshot{ID: gid, CreatedAt: now}
	var tmps []string
	cleanup := func() {
		for _, t := range tmps {
			if err := engine.Remove(t); err != nil {
				klog.ErrorS(err, "Could not remove data of a failed group snapshot; it is removed at restart", "path", t)
			}
		}
	}
	for _, v := range vols {
		s := &contract.Snapshot{ID: memberID[v.ID], Name: memberName(gid, v.ID), SourceVolumeID: v.ID, SizeBytes: v.CapacityBytes,
			AccessType: v.AccessType, FsType: v.FsType, Engine: v.Engine, CreatedAt: now, GroupSnapshotID: gid}
		g.Snapshots = append(g.Snapshots, s)
		tmps = append(tmps, inFlight(creatingPrefix, m.snapPath(s)))
	}
	if err := m.cutGroup(vols, pods, tmps); err != nil {
		cleanup()
		return nil, mapNoSpace(err)
	}
	if err := m.st.Update(func(tx *state.Tx) error {
		for _, s := range g.Snapshots {
			if err := tx.PutSnapshot(s); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		cleanup()
		return nil, err
	}
	for i, s := range g.Snapshots {
		if err := m.land(tmps[i], m.snapPath(s)); err != nil {
			// The records stay and so does the data: the next start
			// finishes the landing (recover), as for one snapshot.
			return nil, fmt.Errorf("%w: the group snapshot is finished at restart", err)
		}
	}
	klog.V(2).InfoS("Group snapshot created", "groupSnapshotID", gid, "sourceVolumeIDs", ids)
	return g, nil
}

// dirMounts are the mount points of directory volume id's directory.
func dirMounts(id string) ([]string, error) {
	suffix := "/volumes/" + id
	mounts, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return !strings.HasSuffix(i.Root, suffix), false
	})
	var points []string
	for _, i := range mounts {
		points = append(points, i.Mountpoint)
	}
	return points, err
}

// flushDevice writes out what the page cache of image's read-write loop
// device holds (fsync of the device), so that a copy of the image has
// every write made to the device so far; an image not attached has none.
func flushDevice(image string) error {
	dev, err := block.FindMode(image, false)
	if err != nil || dev == "" {
		return err
	}
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", dev, err)
	}
	return nil
}

// cutGroup copies the data of vols to tmps at one point in time: first
// the pods that use them are frozen (their processes stopped), then every
// staged image volume's filesystem (FIFREEZE), and what a frozen pod
// wrote to a raw block volume is flushed to its image; all are thawed once
// every copy is made, and the copies synced after the thaw.
func (m *Manager) cutGroup(vols []*contract.Volume, pods, tmps []string) error {
	var thaws []func() error
	thawAll := func() error {
		var errs []error
		for i := len(thaws) - 1; i >= 0; i-- {
			errs = append(errs, thaws[i]())
		}
		thaws = nil
		return errors.Join(errs...)
	}
	defer thawAll()
	for _, uid := range pods {
		thaw, err := m.freezePod(uid)
		if errors.Is(err, cgroup.ErrNoPod) {
			return fmt.Errorf("%w: %v (is --cgroup-root the host's cgroup hierarchy?)", contract.ErrPrecondition, err)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", contract.ErrBusy, err)
		}
		thaws = append(thaws, thaw)
	}
	for _, v := range vols {
		switch {
		case v.FsType != "":
			thaw, err := m.freezeStaged(v)
			if err != nil {
				return err
			}
			thaws = append(thaws, thaw)
		case v.AccessType == contract.AccessBlock && len(pods) > 0:
			if err := flushDevice(m.imagePath(v.ID)); err != nil {
				return err
			}
		}
	}
	for i, v := range vols {
		if err := m.cutSnapshot(v, tmps[i], m.copyImage); err != nil {
			return err
		}
	}
	if err := thawAll(); err != nil {
		return err
	}
	for _, t := range tmps {
		if err := syncFS(t); err != nil {
			return err
		}
	}
	return nil
}

// GetGroupSnapshot returns group snapshot id. snapshotIDs, when given,
// must be its members' ids (contract.ErrInvalid otherwise). Errors:
// contract.ErrNotFound (no member left, or not an id of the driver's
// shape).
func (m *Manager) GetGroupSnapshot(id string, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	if !contract.ValidGroupSnapshotID(id) {
		return nil, fmt.Errorf("%w: group snapshot %q", contract.ErrNotFound, id)
	}
	all, _, err := m.ListSnapshots("", 0, "")
	if err != nil {
		return nil, err
	}
	g := &contract.GroupSnapshot{ID: id}
	for _, s := range all {
		if s.GroupSnapshotID == id {
			g.Snapshots = append(g.Snapshots, s)
			g.CreatedAt = s.CreatedAt
		}
	}
	if len(g.Snapshots) == 0 {
		return nil, fmt.Errorf("%w: group snapshot %q", contract.ErrNotFound, id)
	}
	slices.SortFunc(g.Snapshots, func(a, b *contract.Snapshot) int { return strings.Compare(a.SourceVolumeID, b.SourceVolumeID) })
	var members []string
	for _, s := range g.Snapshots {
		members = append(members, s.ID)
	}
	exists := func(id string) bool { _, err := m.GetSnapshot(id); return err == nil }
	if err := contract.CheckGroupMembers(id, members, snapshotIDs, exists); err != nil {
		return nil, err
	}
	return g, nil
}

// DeleteGroupSnapshot deletes every member snapshot of group id (each as
// DeleteSnapshot does: record, then data). An unknown id succeeds.
// Errors: contract.ErrInvalid (snapshotIDs do not match the members),
// contract.ErrBusy (a restore reads a member, or another call on the
// group runs).
func (m *Manager) DeleteGroupSnapshot(id string, snapshotIDs []string) error {
	if !contract.ValidGroupSnapshotID(id) {
		return nil
	}
	unlock, err := m.lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	g, err := m.GetGroupSnapshot(id, snapshotIDs)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range g.Snapshots {
		if err := m.DeleteSnapshot(s.ID); err != nil {
			return err
		}
	}
	klog.V(2).InfoS("Group snapshot deleted", "groupSnapshotID", id)
	return nil
}
