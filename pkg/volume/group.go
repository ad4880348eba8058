package volume

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

// Volume group snapshots: a group is its member snapshots, whose records
// carry the group's id and are committed in one transaction. CSI asks for
// write-order consistency, so members are cut while nothing can write to
// them: staged image volumes' filesystems are frozen, and the pods that use
// directory or raw block volumes (btrfs cannot snapshot a frozen filesystem).

// memberName is the record name of group gid's snapshot of volume volID:
// it starts with a NUL byte, which no CSI name may contain.
func memberName(gid, volID string) string { return "\x00group/" + gid + "/" + volID }

// CreateGroup cuts one snapshot of each of sourceIDs at one point in time for
// the CSI name (cutGroup; the freeze lasts only the copies, milliseconds with
// reflinks) and commits them in one transaction; a failure leaves nothing. A
// retry with the same name and volumes returns the group. Errors:
// contract.ErrInvalid, contract.ErrNotFound, contract.ErrExists (the name
// holds other volumes), contract.ErrPrecondition (a writer no pod freeze can
// stop), contract.ErrBusy, contract.ErrNoSpace.
func (sn *Snapshots) CreateGroup(name string, sourceIDs []string) (*contract.GroupSnapshot, error) {
	return sn.CreateGroupWithIDs(name, sourceIDs, nil)
}

// CreateGroupWithIDs is CreateGroup with the member snapshot ids chosen by
// the cluster controller (snapshotIDs[i] for sourceIDs[i]; nil: fresh).
func (sn *Snapshots) CreateGroupWithIDs(name string, sourceIDs, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	m := sn.m
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
	if g, err := sn.GetGroup(gid, nil); err == nil {
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
		vols = append(vols, v)
	}

	now := time.Now().UTC()
	g := &contract.GroupSnapshot{ID: gid, CreatedAt: now}
	var dsts []string
	for _, v := range vols {
		s := &contract.Snapshot{ID: memberID[v.ID], Name: memberName(gid, v.ID), SourceVolumeID: v.ID, SizeBytes: v.CapacityBytes,
			AccessType: v.AccessType, FsType: v.FsType, Engine: v.Engine, CreatedAt: now, GroupSnapshotID: gid, KeySalt: v.KeySalt}
		g.Snapshots = append(g.Snapshots, s)
		dsts = append(dsts, m.snapPath(s))
	}
	// A rename that fails leaves the records and the data: the next start
	// finishes the landing (no uncommit), as for one snapshot.
	if err := m.land(landing{
		what:  "group snapshot",
		dsts:  dsts,
		write: func(tmps []string) error { return sn.cutGroup(vols, tmps) },
		commit: func(tx *state.Tx) error {
			for _, s := range g.Snapshots {
				if err := tx.PutSnapshot(s); err != nil {
					return err
				}
			}
			return nil
		},
	}); err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Group snapshot created", "groupSnapshotID", gid, "sourceVolumeIDs", ids)
	return g, nil
}

// cutGroup copies vols to tmps at one point in time (Node.FreezeGroup) and
// syncs the copies after the thaw.
func (sn *Snapshots) cutGroup(vols []*contract.Volume, tmps []string) error {
	m := sn.m
	thaw, err := m.node.FreezeGroup(vols)
	if err != nil {
		return err
	}
	defer thaw()
	for i, v := range vols {
		if err := sn.cutSnapshot(v, tmps[i], sn.copyImage); err != nil {
			return err
		}
	}
	if err := thaw(); err != nil {
		return err
	}
	for _, t := range tmps {
		if err := syncFS(t); err != nil {
			return err
		}
	}
	return nil
}

// GetGroup returns group snapshot id; snapshotIDs, when given, must be its
// members' (contract.ErrInvalid). Errors: contract.ErrNotFound.
func (sn *Snapshots) GetGroup(id string, snapshotIDs []string) (*contract.GroupSnapshot, error) {
	if !contract.ValidGroupSnapshotID(id) {
		return nil, fmt.Errorf("%w: group snapshot %q", contract.ErrNotFound, id)
	}
	all, _, err := sn.List("", 0, "")
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
	exists := func(id string) bool { _, err := sn.Get(id); return err == nil }
	if err := contract.CheckGroupMembers(id, members, snapshotIDs, exists); err != nil {
		return nil, err
	}
	return g, nil
}

// DeleteGroup deletes every member snapshot of group id; an unknown id
// succeeds. Errors: contract.ErrInvalid (snapshotIDs), contract.ErrBusy.
func (sn *Snapshots) DeleteGroup(id string, snapshotIDs []string) error {
	m := sn.m
	if !contract.ValidGroupSnapshotID(id) {
		return nil
	}
	unlock, err := m.lock(id)
	if err != nil {
		return err
	}
	defer unlock()
	g, err := sn.GetGroup(id, snapshotIDs)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range g.Snapshots {
		if err := sn.Delete(s.ID); err != nil {
			return err
		}
	}
	klog.V(2).InfoS("Group snapshot deleted", "groupSnapshotID", id)
	return nil
}
