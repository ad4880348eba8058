package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Send writes to w the stream (engine.SendFile, engine.SendTree) of the
// source of spec — a create on another node: spec.SourceSnapshotID or
// spec.SourceVolumeID, checked against spec as a local create checks its
// source. A snapshot is read-held for the whole stream, so it cannot be
// deleted under it (case C34). A volume is first copied to a private
// point-in-time copy under sending/ — a read-only btrfs snapshot, the
// engine's copy of a directory, a reflink or copy of an image with its
// filesystem frozen, as a local clone makes — then released and the copy
// sent and removed (also at start, should the process die first). Errors:
// contract.ErrNotFound, contract.ErrInvalid, contract.ErrOutOfRange,
// contract.ErrBusy, or the stream's.
func (m *Store) Send(spec contract.CreateSpec, w io.Writer) (engine.StreamStats, error) {
	if err := m.staysHere(spec); err != nil {
		return engine.StreamStats{}, err
	}
	path, release, err := m.sendSource(spec)
	if err != nil {
		return engine.StreamStats{}, err
	}
	defer release()
	base, releaseBase := m.sendBase(spec)
	defer releaseBase()
	var st engine.StreamStats
	if filepath.Ext(path) == ".img" && base != "" {
		st, err = engine.SendFileDelta(path, base, w)
	} else if filepath.Ext(path) == ".img" {
		st, err = engine.SendFile(path, w)
	} else {
		st, err = engine.SendTree(path, w)
	}
	if err == nil {
		klog.V(2).InfoS("Sent data to another node", "volumeID", spec.ID, "sourceSnapshot", spec.SourceSnapshotID,
			"sourceVolume", spec.SourceVolumeID, "bytes", st.Bytes, "entries", st.Entries)
	}
	return st, err
}

// staysHere refuses (contract.ErrPrecondition) to send an encrypted
// directory volume or its snapshot: its files are read and written with
// its key, which the receiving node does not have before a stage.
func (m *Store) staysHere(spec contract.CreateSpec) error {
	what, salt := "", []byte(nil)
	if s, err := m.snaps.Get(spec.SourceSnapshotID); err == nil {
		what, salt = "snapshot "+s.ID, s.KeySalt
	} else if v, err := m.Get(spec.SourceVolumeID); err == nil {
		what, salt = "volume "+v.ID, v.KeySalt
	}
	if salt == nil {
		return nil
	}
	return fmt.Errorf("%w: %s is an encrypted directory volume's and cannot leave its node; restore or clone it on that node, or use an encrypted image volume (csi.storage.k8s.io/fstype: ext4), whose ciphertext moves between nodes", contract.ErrPrecondition, what)
}

// sendBase returns the image of spec.BaseSnapshotID, read-held until its
// release, when a snapshot's image can be sent as its difference from it;
// "" (the whole snapshot is sent) for none, or one this node cannot use.
func (m *Store) sendBase(spec contract.CreateSpec) (string, func()) {
	nop := func() {}
	if spec.BaseSnapshotID == "" || spec.SourceSnapshotID == "" || spec.BaseSnapshotID == spec.SourceSnapshotID {
		return "", nop
	}
	release, err := m.holds.read(spec.BaseSnapshotID, "a transfer's base")
	if err != nil {
		return "", nop
	}
	b, err := m.snaps.Get(spec.BaseSnapshotID)
	if err != nil || !b.Image() || b.AccessType != spec.AccessType || b.FsType != spec.FsType {
		release()
		return "", nop
	}
	return m.snapPath(b), release
}

// sendSource returns the path Send reads and its release: the held snapshot,
// or a private copy of the volume.
func (m *Store) sendSource(spec contract.CreateSpec) (string, func(), error) {
	if spec.SourceSnapshotID == spec.SourceVolumeID || (spec.SourceSnapshotID != "" && spec.SourceVolumeID != "") {
		return "", nil, fmt.Errorf("%w: a transfer needs exactly one source", contract.ErrInvalid)
	}
	if spec.SourceSnapshotID != "" {
		return m.holdSource(spec)
	}
	unlock, err := m.lock(spec.SourceVolumeID)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	src, releaseSrc, err := m.holdSource(spec)
	if err != nil {
		return "", nil, err
	}
	defer releaseSrc()
	v, err := m.Get(spec.SourceVolumeID)
	if err != nil {
		return "", nil, err
	}
	tmp := filepath.Join(m.sendRoot, contract.NewVolumeID())
	if v.Image() {
		tmp += ".img"
		err = m.whileFrozen(v, func() error { return writeImage(tmp, src, v.CapacityBytes) })
	} else {
		err = m.eng.Snapshot(src, tmp)
	}
	remove := func() {
		if err := engine.Remove(tmp); err != nil {
			klog.ErrorS(err, "Could not remove the copy of a volume sent to another node; it is removed at restart", "path", tmp)
		}
	}
	if err != nil {
		remove()
		return "", nil, mapNoSpace(fmt.Errorf("copy volume %s for the transfer: %w", v.ID, err))
	}
	return tmp, remove, nil
}

// Receive creates the volume of spec from the stream r that another node's
// Send writes (spec's source ids are that node's; they are recorded, not
// read). The data lands as a local create's does (write → commit → land):
// the record is committed only once the whole stream has been applied and
// its digest matched, so a transfer cut short, refused or wrong leaves
// nothing but .creating- data that land (or start-up recovery) removes.
// progress, when set, is told the data bytes applied and the sender's
// estimate of the total. Errors: as Create's, contract.ErrNoSpace when the
// data does not fit, or the stream's.
func (m *Store) Receive(spec contract.CreateSpec, r io.Reader, progress func(done, total int64)) (*contract.Volume, error) {
	given := spec.ID != ""
	if err := checkCreateSpec(&spec); err != nil {
		return nil, err
	}
	release, err := m.lockChange("a transfer", spec.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if given {
		if v, err := m.Get(spec.ID); err == nil {
			return v, nil
		}
	}
	return m.make(spec, func(v *contract.Volume, tmp string) error {
		if v.Image() {
			if _, err := engine.Receive(r, tmp, engine.StreamFile, v.CapacityBytes, progress); err != nil {
				return err
			}
			if err := preallocate(tmp, v.CapacityBytes); err != nil {
				return err
			}
		} else {
			if err := m.eng.Create(tmp, v.CapacityBytes, spec.DirMode); err != nil {
				return err
			}
			if _, err := engine.Receive(r, tmp, engine.StreamTree, v.CapacityBytes, progress); err != nil {
				return err
			}
		}
		return syncFS(tmp)
	})
}

// Receive makes this node's copy of snapshot s, cut on another node, from
// the stream r that node's Send writes, under s.ID: restores on this node
// then read it as they read a snapshot cut here. It lands as a snapshot
// does (write → commit → land), the record only once the whole stream has
// been applied and its digest matched; a directory snapshot is received
// into a new volume of the engine (a btrfs subvolume that restores
// snapshot). With base (a snapshot of the same volume this node holds,
// read-held meanwhile) the sender may send an image as its difference
// from it. An id this node holds already returns its record. Errors:
// contract.ErrNoSpace when the data does not fit, contract.ErrBusy, or the
// stream's.
func (sn *Snapshots) Receive(s contract.Snapshot, base string, r io.Reader, progress func(done, total int64)) (*contract.Snapshot, error) {
	m := sn.m
	if !contract.ValidSnapshotID(s.ID) || s.SizeBytes <= 0 || base != "" && (!contract.ValidSnapshotID(base) || base == s.ID) {
		return nil, fmt.Errorf("%w: snapshot copy %q of %d bytes (base %q)", contract.ErrInvalid, s.ID, s.SizeBytes, base)
	}
	release, err := m.lockChange("a snapshot copy", s.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if have, err := sn.Get(s.ID); err == nil {
		return have, nil
	}
	basePath := ""
	if base != "" {
		releaseBase, err := m.holds.read(base, "a snapshot copy's base")
		if err != nil {
			return nil, err
		}
		defer releaseBase()
		b, err := sn.Get(base)
		if err != nil {
			return nil, err
		}
		if !b.Image() {
			return nil, fmt.Errorf("%w: the base snapshot %s is not an image", contract.ErrInvalid, base)
		}
		basePath = m.snapPath(b)
	}
	s.Copy, s.Engine, s.Node, s.Nodes, s.GroupSnapshotID = true, m.eng.Name(), "", nil, ""
	if err := m.land(landing{
		what: "snapshot copy",
		dsts: []string{m.snapPath(&s)},
		write: func(tmps []string) error {
			tmp := tmps[0]
			if err := engine.Remove(tmp); err != nil {
				return err
			}
			if s.Image() {
				if _, err := engine.ReceiveImage(r, tmp, basePath, s.SizeBytes, progress); err != nil {
					return mapNoSpace(err)
				}
			} else {
				if err := m.eng.Create(tmp, s.SizeBytes, 0o755); err != nil {
					return mapNoSpace(err)
				}
				if _, err := engine.Receive(r, tmp, engine.StreamTree, s.SizeBytes, progress); err != nil {
					return mapNoSpace(err)
				}
			}
			return syncFS(tmp)
		},
		commit:   func(tx *state.Tx) error { return tx.PutSnapshot(&s) },
		uncommit: func(tx *state.Tx) error { return tx.DeleteSnapshot(s.ID) },
	}); err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Snapshot copy received", "snapshotID", s.ID, "sourceVolumeID", s.SourceVolumeID, "size", s.SizeBytes)
	return &s, nil
}

// removeSendCopies removes what a Send cut short by a crash left in sending/
// (private copies; nothing acknowledges them).
func (m recovery) removeSendCopies() {
	ents, err := os.ReadDir(m.sendRoot)
	if err != nil {
		m.leftover(m.sendRoot, err)
		return
	}
	for _, e := range ents {
		p := filepath.Join(m.sendRoot, e.Name())
		if err := engine.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.leftover(p, fmt.Errorf("remove the copy of a volume an interrupted transfer was sending: %w", err))
			continue
		}
		klog.InfoS("Removed the copy of a volume an interrupted transfer was sending", "path", p)
	}
}
