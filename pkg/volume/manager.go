// Package volume is localdir's node-local data plane: it owns one data root
// and keeps there the volumes, snapshots, their durable records (pkg/state)
// and the capacity accounting. It also performs the node-side work (stage,
// publish, loop devices) on the paths the CO passes, through a
// mount.Interface (pkg/mount) that does the mounts.
//
// Layout of the data root:
//
//	<root>/state.db              durable records (pkg/state)
//	<root>/volumes/<id>/         a mount volume (directory or btrfs subvolume)
//	<root>/block/<id>.img        a raw block volume (image file, allocated to its size)
//	<root>/snapshots/<sid>/      a snapshot of a mount volume
//	<root>/snapshots/<sid>.img   a snapshot of a block volume
//	<dir>/.creating-<name>       data a create or snapshot is still writing, in the
//	                             directory of its final name (removed at start
//	                             when no record acknowledges it)
//	<dir>/.deleting-<name>       data of a delete in flight, in its own directory
//	                             (gone once its record is)
//	<root>/orphaned/             data no record claimed at start: moved aside, never deleted
//
// Every path below the root is built from a driver-issued id that was checked
// against ValidVolumeID / ValidSnapshotID first. Nothing outside the root and
// the target/staging paths given by the CO is created, changed or removed.
package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/keylock"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/block"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Config configures a Manager.
type Config struct {
	// DataRoot is the directory holding everything the manager stores. It is
	// created (mode 0700) if missing; its parent must exist.
	DataRoot string
	// CapacityBytes caps the bytes that volumes may reserve in total; 0 means
	// the size of the filesystem holding DataRoot.
	CapacityBytes int64
	// Engine is engine.Auto (default), engine.Dir or engine.Btrfs.
	Engine string
	// Mounter does the node mounts and answers what is mounted where
	// (stage, publish, delete's in-use check); nil means mount.New(), the
	// real one. Unit tests give a mount.Fake.
	Mounter mount.Interface
}

// Manager is the data plane of one data root. Its methods are safe for
// concurrent use. Operations that read a volume or snapshot (restore,
// clone, snapshot, stage) hold it against operations that delete or change
// it, whoever the caller is; the loser fails with contract.ErrBusy (see holdSet).
// Node and data operations on one volume also take its per-volume lock
// (locks.go).
type Manager struct {
	root      string // absolute, symlinks resolved
	volRoot   string
	blockRoot string
	snapRoot  string
	lostRoot  string // unclaimed data moved aside at start, never deleted by the driver
	cfg       Config
	eng       engine.Engine
	st        *state.Store
	holds     *holdSet
	locks     *keylock.Set    // the per-volume lock (locks.go)
	mnt       mount.Interface // node mounts and the mount table

	mu        sync.Mutex // guards allocated and inflight; held for arithmetic, never across I/O
	allocated int64      // sum of CapacityBytes of all recorded volumes, plus reservations
	// inflight is the part of the reservations whose data is still being
	// written (creates, expansions): statfs free space does not show it
	// yet, so concurrent reservations must not count it as free.
	inflight int64
	// leftovers is what recovery at Open could not put in order.
	leftovers []Leftover
}

// Open prepares the data root, opens its state file and finishes or rolls
// back work a crash interrupted (see recover): the data of creates nobody
// was told about and of deletes whose record is gone is removed, data no
// record accounts for is moved to orphaned/, and ephemeral volumes that are
// no longer mounted (the node rebooted) are removed. A leftover that cannot
// be handled never stops the start: it is listed in Leftovers.
//
// It fails when the state file is damaged (wrapping state.ErrCorrupt) and
// when the state file is missing but volume data exists: starting with empty
// state there would orphan every volume, so a person has to decide.
func Open(cfg Config) (*Manager, error) {
	if cfg.DataRoot == "" || !filepath.IsAbs(cfg.DataRoot) {
		return nil, fmt.Errorf("data root %q must be an absolute path", cfg.DataRoot)
	}
	if err := os.Mkdir(cfg.DataRoot, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create data root: %w", err)
	}
	root, err := filepath.EvalSymlinks(cfg.DataRoot)
	if err != nil {
		return nil, fmt.Errorf("resolve data root: %w", err)
	}
	m := &Manager{
		root:      root,
		volRoot:   filepath.Join(root, "volumes"),
		blockRoot: filepath.Join(root, "block"),
		snapRoot:  filepath.Join(root, "snapshots"),
		lostRoot:  filepath.Join(root, "orphaned"),
		cfg:       cfg,
		holds:     newHolds(),
		locks:     keylock.New(),
		mnt:       cfg.Mounter,
	}
	if m.mnt == nil {
		m.mnt = mount.New()
	}
	for _, d := range []string{m.volRoot, m.blockRoot, m.snapRoot, m.lostRoot} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	statePath := filepath.Join(root, state.FileName)
	if _, err := os.Stat(statePath); errors.Is(err, os.ErrNotExist) {
		n := countIDs(m.volRoot, ValidVolumeID) + countIDs(m.blockRoot, validImage(ValidVolumeID)) +
			countIDs(m.snapRoot, ValidSnapshotID) + countIDs(m.snapRoot, validImage(ValidSnapshotID))
		if n > 0 {
			return nil, fmt.Errorf("state file %s is missing but %s holds %d volume(s) or snapshot(s); refusing to start with empty state. "+
				"Restore the state file from a backup, or move the data away if it is not needed", statePath, root, n)
		}
	}
	m.eng, err = engine.New(cfg.Engine, root)
	if err != nil {
		return nil, err
	}
	st, err := state.Open(statePath)
	if err != nil {
		return nil, err
	}
	m.st = st
	if err := m.recover(); err != nil {
		_ = st.Close()
		return nil, err
	}
	return m, nil
}

// Close closes the state file.
func (m *Manager) Close() error { return m.st.Close() }

// Root is the resolved data root.
func (m *Manager) Root() string { return m.root }

// Engine is the name of the engine new mount volumes are made with.
func (m *Manager) Engine() string { return m.eng.Name() }

// AttachedLoopDevices counts the loop devices attached to this data root's
// block volume images.
func (m *Manager) AttachedLoopDevices() int { return block.CountUnder(m.blockRoot) }

// Probe checks that the data root is usable and the state file readable.
func (m *Manager) Probe() error {
	if err := unix.Access(m.volRoot, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("data root %s not writable: %w", m.volRoot, err)
	}
	return m.st.View(func(*state.Tx) error { return nil })
}

func validImage(valid func(string) bool) func(string) bool {
	return func(n string) bool {
		id, ok := strings.CutSuffix(n, ".img")
		return ok && valid(id)
	}
}

func countIDs(dir string, valid func(string) bool) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if valid(e.Name()) {
			n++
		}
	}
	return n
}

// volDir is the data directory of a mount volume. It panics on an id that
// does not match the volume id pattern: callers validate first, and a path
// must never be built from anything else.
func (m *Manager) volDir(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.volRoot, id)
}

// imagePath is the image file of a block volume.
func (m *Manager) imagePath(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.blockRoot, id+".img")
}

// DataPath is where volume v's data lives on this node (for status and
// logs; the manager builds it from the validated id).
func (m *Manager) DataPath(v *contract.Volume) string { return m.dataPath(v) }

// dataPath is where volume v's data lives.
func (m *Manager) dataPath(v *contract.Volume) string {
	if v.AccessType == contract.AccessBlock {
		return m.imagePath(v.ID)
	}
	return m.volDir(v.ID)
}

func mustVolumeID(id string) {
	if !ValidVolumeID(id) {
		panic(fmt.Sprintf("volume: path requested for invalid volume id %q", id))
	}
}

// CapacityInfo is the capacity of the data root, in bytes.
type CapacityInfo struct {
	// Total is the configured capacity, or the filesystem's size.
	Total int64
	// Allocated is the sum of the sizes of existing volumes.
	Allocated int64
	// Free is the free space of the filesystem (statfs f_bavail).
	Free int64
	// Available is what a new volume may still reserve:
	// min(Total - Allocated, Free - space reserved by creates and
	// expansions still writing), never negative.
	Available int64
}

// Capacity reports the data root's capacity (statfs(2) on the data root).
func (m *Manager) Capacity() (CapacityInfo, error) {
	m.mu.Lock()
	alloc, inflight := m.allocated, m.inflight
	m.mu.Unlock()
	return m.capacityWith(alloc, inflight)
}

func (m *Manager) capacityWith(alloc, inflight int64) (CapacityInfo, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(m.root, &sfs); err != nil {
		return CapacityInfo{}, fmt.Errorf("statfs %s: %w", m.root, err)
	}
	ci := CapacityInfo{
		Total:     int64(sfs.Blocks) * sfs.Bsize,
		Free:      int64(sfs.Bavail) * sfs.Bsize,
		Allocated: alloc,
	}
	if m.cfg.CapacityBytes > 0 {
		ci.Total = m.cfg.CapacityBytes
	}
	ci.Available = max(min(ci.Total-alloc, ci.Free-inflight), 0)
	return ci, nil
}

// reserve takes n bytes of capacity or fails with contract.ErrNoSpace. The caller
// calls settle(n) once the data is written (or failed), and release(n) if
// the reservation is given up.
func (m *Manager) reserve(n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ci, err := m.capacityWith(m.allocated, m.inflight)
	if err != nil {
		return err
	}
	if n > ci.Available {
		return fmt.Errorf("%w: %d bytes requested, %d available on node data root", contract.ErrNoSpace, n, ci.Available)
	}
	m.allocated += n
	m.inflight += n
	return nil
}

// settle ends the in-flight part of a reservation of n bytes: its data is
// written, so statfs counts it now (or it failed and was removed).
func (m *Manager) settle(n int64) {
	m.mu.Lock()
	m.inflight -= n
	m.mu.Unlock()
}

func (m *Manager) release(n int64) {
	m.mu.Lock()
	m.allocated -= n
	m.mu.Unlock()
}

// CreateSpec describes a new volume.
type CreateSpec struct {
	// ID is the volume_id to use; empty means a fresh random one. The
	// cluster controller chooses ids, and a node creating an id it already
	// holds gets the existing volume back (the reconciler's idempotency).
	ID string
	// Name is the CSI name (stored, never used in a path).
	Name string
	// SizeBytes is the capacity to reserve, in bytes (> 0).
	SizeBytes int64
	// AccessType is contract.AccessMount or contract.AccessBlock.
	AccessType string
	// Parameters are stored with the record.
	Parameters map[string]string
	// DirMode is the permission of a mount volume's root directory (chmod(2)
	// bits, e.g. 0o2770).
	DirMode uint32
	// SourceSnapshotID / SourceVolumeID fill the new volume with a copy of
	// a snapshot or another volume (at most one is set).
	SourceSnapshotID, SourceVolumeID string
	// Ephemeral marks a CSI ephemeral inline volume created for the
	// CO-chosen EphemeralID; Name must be EphemeralName(EphemeralID).
	Ephemeral   bool
	EphemeralID string
}

// EphemeralName is the name key under which the ephemeral volume for a
// CO-chosen volume_id is recorded. It starts with a NUL byte, which no CSI
// name may contain, so it never collides with a CreateVolume name.
func EphemeralName(coID string) string { return "\x00ephemeral/" + coID }

// Create makes a new volume, filled from a snapshot or volume when the spec
// names one, and commits its record durably before it returns. The source
// is held for the whole copy: deleting it meanwhile fails with contract.ErrBusy, and
// a create that finds it being deleted fails with contract.ErrBusy too (case C34). The
// data is written under a .creating- name and gets its final name only
// after the record is committed, so a crash never leaves unacknowledged
// data that recovery cannot tell from data it must keep. On any failure
// nothing is left behind: no data, no record, no reserved capacity.
// Errors: contract.ErrNoSpace (capacity or disk full), contract.ErrNotFound (source),
// contract.ErrInvalid (source of another access type), contract.ErrOutOfRange (size below the
// source's), contract.ErrExists (name taken by a concurrent create), contract.ErrBusy.
func (m *Manager) Create(spec CreateSpec) (*contract.Volume, error) {
	if spec.SizeBytes <= 0 {
		return nil, fmt.Errorf("%w: size %d", contract.ErrInvalid, spec.SizeBytes)
	}
	if spec.AccessType != contract.AccessMount && spec.AccessType != contract.AccessBlock {
		return nil, fmt.Errorf("%w: access type %q", contract.ErrInvalid, spec.AccessType)
	}
	given := spec.ID != ""
	if !given {
		spec.ID = NewVolumeID()
	} else if !ValidVolumeID(spec.ID) {
		return nil, fmt.Errorf("%w: volume id %q", contract.ErrInvalid, spec.ID)
	}
	unlock, err := m.lock(spec.ID, spec.SourceVolumeID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	release, err := m.holds.change(spec.ID, "a create")
	if err != nil {
		return nil, err
	}
	defer release()
	if given { // the node already holds it: the reconciler's idempotency
		if v, err := m.Get(spec.ID); err == nil {
			return v, nil
		}
	}
	srcPath, releaseSrc, err := m.holdSource(spec)
	if err != nil {
		return nil, err
	}
	defer releaseSrc()
	if err := m.reserve(spec.SizeBytes); err != nil {
		return nil, err
	}
	v := &contract.Volume{
		ID:               spec.ID,
		Name:             spec.Name,
		CapacityBytes:    spec.SizeBytes,
		AccessType:       spec.AccessType,
		Parameters:       spec.Parameters,
		SourceSnapshotID: spec.SourceSnapshotID,
		SourceVolumeID:   spec.SourceVolumeID,
		Ephemeral:        spec.Ephemeral,
		EphemeralID:      spec.EphemeralID,
		Engine:           m.eng.Name(),
		CreatedAt:        time.Now().UTC().Truncate(time.Second),
	}
	dst := m.dataPath(v)
	tmp := inFlight(creatingPrefix, dst)
	fail := func(err error) (*contract.Volume, error) {
		if rerr := engine.Remove(tmp); rerr != nil {
			klog.ErrorS(rerr, "Could not remove data of a failed create; it is removed at restart", "path", tmp)
		}
		m.release(spec.SizeBytes)
		return nil, mapNoSpace(err)
	}
	// A failed earlier attempt for the same id (cluster mode retries a
	// create under its id) may have left its data; nobody was told of it.
	if err := engine.Remove(tmp); err != nil {
		m.settle(spec.SizeBytes)
		return fail(err)
	}
	switch {
	case spec.AccessType == contract.AccessBlock:
		v.Engine = "image"
		err = writeImage(tmp, srcPath, spec.SizeBytes)
		if err == nil {
			err = preallocate(tmp, spec.SizeBytes)
		}
	case spec.SourceSnapshotID != "":
		err = m.eng.Restore(srcPath, tmp, spec.SizeBytes)
	case srcPath != "":
		err = m.eng.Clone(srcPath, tmp, spec.SizeBytes)
	default:
		err = m.eng.Create(tmp, spec.SizeBytes, spec.DirMode)
	}
	if err == nil && (srcPath != "" || spec.AccessType == contract.AccessBlock) {
		// A restore, clone or image holds data: on disk before the record
		// that acknowledges it.
		err = syncFS(tmp)
	}
	m.settle(spec.SizeBytes)
	if err != nil {
		return fail(fmt.Errorf("create volume data: %w", err))
	}
	err = m.st.Update(func(tx *state.Tx) error {
		if spec.Name != "" && tx.VolumeIDByName(spec.Name) != "" {
			return fmt.Errorf("%w: volume name %q", contract.ErrExists, spec.Name)
		}
		return tx.PutVolume(v)
	})
	if err != nil {
		return fail(err)
	}
	if err := m.land(tmp, dst); err != nil {
		if rerr := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(v.ID) }); rerr != nil {
			// The record stays: so do its data and its reservation; the
			// next start finishes the create (recover).
			return nil, fmt.Errorf("%w; and its record could not be taken back (%v): the create is finished at restart", err, rerr)
		}
		return fail(err)
	}
	klog.V(2).InfoS("Volume created", "volumeID", v.ID, "size", v.CapacityBytes, "accessType", v.AccessType,
		"engine", v.Engine, "sourceSnapshot", v.SourceSnapshotID, "sourceVolume", v.SourceVolumeID)
	return v, nil
}

// land gives data written under its .creating- name its final name, once
// its record is committed (a crash before this is finished at start).
func (m *Manager) land(tmp, dst string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, dst, err)
	}
	return nil
}

// holdSource takes a read hold on the snapshot or volume a create copies
// from, checks it, and returns its data path and the release func (a no-op
// without a source). Errors: contract.ErrBusy (being deleted or changed),
// contract.ErrNotFound, contract.ErrInvalid, contract.ErrOutOfRange.
func (m *Manager) holdSource(spec CreateSpec) (string, func(), error) {
	nop := func() {}
	if spec.SourceSnapshotID == "" && spec.SourceVolumeID == "" {
		return "", nop, nil
	}
	kind, id, what := "volume", spec.SourceVolumeID, "a clone"
	if spec.SourceSnapshotID != "" {
		kind, id, what = "snapshot", spec.SourceSnapshotID, "a restore"
	}
	release, err := m.holds.read(id, what)
	if err != nil {
		return "", nop, err
	}
	var p, accessType string
	var size int64
	if kind == "snapshot" {
		var s *contract.Snapshot
		if s, err = m.GetSnapshot(id); err == nil {
			p, accessType, size = m.snapPath(s), s.AccessType, s.SizeBytes
		}
	} else {
		var v *contract.Volume
		if v, err = m.Get(id); err == nil {
			p, accessType, size = m.dataPath(v), v.AccessType, v.CapacityBytes
		}
	}
	if err == nil {
		err = checkSource(kind, id, accessType, size, spec)
	}
	if err != nil {
		release()
		return "", nop, err
	}
	return p, release, nil
}

func checkSource(kind, id, accessType string, size int64, spec CreateSpec) error {
	if accessType != spec.AccessType {
		return fmt.Errorf("%w: source %s %s holds a %s volume, the request asks for %s", contract.ErrInvalid, kind, id, accessType, spec.AccessType)
	}
	if spec.SizeBytes < size {
		return fmt.Errorf("%w: requested %d bytes, smaller than the %d bytes of source %s %s", contract.ErrOutOfRange, spec.SizeBytes, size, kind, id)
	}
	return nil
}

// writeImage creates the image file dst of size bytes: sparse and empty, or
// a copy of the image src (reflinked where possible) grown to size.
func writeImage(dst, src string, size int64) error {
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if src != "" {
		in, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		if _, _, err := engine.CopyData(out, in); err != nil {
			return err
		}
	}
	return unix.Ftruncate(out, size)
}

// preallocate allocates disk blocks for the whole image at path
// (fallocate(2) mode 0: data kept, holes filled, extents shared with a
// snapshot stay shared). A raw block volume must own its space: with a
// sparse image the data root can fill up under a pod's loop device, and its
// writes turn into I/O errors; and a create must fail (ENOSPC) when the disk
// cannot hold it. Filesystems without fallocate keep the image sparse.
func preallocate(path string, size int64) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, 0, 0, size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("allocate %d bytes for %s: %w", size, path, err)
	}
	return nil
}

// syncFS writes the dirty data of the filesystem holding p to disk
// (syncfs(2)): one call for a whole copied tree, instead of an fsync per
// file. It runs before the record that acknowledges copied data is
// committed, so a crash never leaves a record whose files are empty.
func syncFS(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", p, err)
	}
	return nil
}

func mapNoSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %v", contract.ErrNoSpace, err)
	}
	return err
}

// LookupByName returns the volume created for a CSI name, or nil.
func (m *Manager) LookupByName(name string) (*contract.Volume, error) {
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
func (m *Manager) Get(id string) (*contract.Volume, error) {
	if !ValidVolumeID(id) {
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
func (m *Manager) Resolve(id string) (*contract.Volume, error) {
	if ValidVolumeID(id) {
		return m.Get(id)
	}
	v, err := m.LookupByName(EphemeralName(id))
	if err == nil && v == nil {
		err = fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return v, err
}

// List returns up to limit volumes (all when limit <= 0) whose ids sort
// after `after`, in id order, and the id to continue after ("" at the end).
// Ephemeral inline volumes are not listed: the CO did not create them.
func (m *Manager) List(after string, limit int) ([]*contract.Volume, string, error) {
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

// Delete removes a volume: its record is removed durably first, then its
// data. Deleting an unknown id succeeds. Snapshots of the volume are
// independent copies and stay usable. Errors: contract.ErrPrecondition when the
// volume is mounted or attached anywhere on this node, contract.ErrBusy while a
// clone, snapshot or stage reads it or another call changes it.
func (m *Manager) Delete(id string) error {
	if !ValidVolumeID(id) {
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
	v, err := m.Get(id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := m.checkUnused(v); err != nil {
		return err
	}
	t, err := m.trash(m.dataPath(v))
	if err != nil {
		return err
	}
	if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(id) }); err != nil {
		_ = os.Rename(t, m.dataPath(v))
		return err
	}
	m.release(v.CapacityBytes)
	// The record is gone, so a crash from here on is finished by recover().
	if err := engine.Remove(t); err != nil {
		klog.ErrorS(err, "Volume record deleted but data removal failed; it will be retried at restart", "volumeID", id)
	}
	klog.V(2).InfoS("Volume deleted", "volumeID", id)
	return nil
}

// checkUnused fails with contract.ErrPrecondition when v is mounted (mount volume) or
// attached to a loop device (block volume).
func (m *Manager) checkUnused(v *contract.Volume) error {
	p := m.dataPath(v)
	if v.AccessType == contract.AccessBlock {
		dev, err := block.Find(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if dev != "" {
			return fmt.Errorf("%w: volume %s is still attached as %s (staged); unpublish and unstage it first", contract.ErrPrecondition, v.ID, dev)
		}
		return nil
	}
	busy, err := m.mnt.InUse(p)
	if err != nil {
		return err
	}
	if busy {
		return fmt.Errorf("%w: volume %s is still mounted (staged or published); unpublish and unstage it first", contract.ErrPrecondition, v.ID)
	}
	return nil
}

// Expand grows volume id to newSize bytes (CSI ControllerExpandVolume): the
// capacity is reserved, the btrfs qgroup limit raised or the image file
// grown (an attached loop device is refreshed by NodeExpand), and the new
// size committed. A newSize at or below the current size changes nothing.
// It returns the volume's capacity afterwards. Errors: contract.ErrNotFound,
// contract.ErrNoSpace, contract.ErrBusy (a snapshot or clone of it, or another change, is in
// progress).
func (m *Manager) Expand(id string, newSize int64) (int64, error) {
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
		return v.CapacityBytes, nil
	}
	delta := newSize - v.CapacityBytes
	if err := m.reserve(delta); err != nil {
		return 0, err
	}
	err = m.resizeData(v, newSize)
	m.settle(delta)
	if err != nil {
		m.release(delta)
		return 0, mapNoSpace(err)
	}
	v.CapacityBytes = newSize
	if err := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(v) }); err != nil {
		m.release(delta)
		return 0, err
	}
	klog.V(2).InfoS("Volume expanded", "volumeID", id, "size", newSize)
	return newSize, nil
}

func (m *Manager) resizeData(v *contract.Volume, size int64) error {
	if v.AccessType == contract.AccessBlock {
		img := m.imagePath(v.ID)
		fi, err := os.Stat(img)
		if err != nil {
			return err
		}
		if size <= fi.Size() { // never shrink: an image only grows
			_, err = block.Refresh(img)
			return err
		}
		if err := unix.Truncate(img, size); err != nil {
			return err
		}
		if err := preallocate(img, size); err != nil {
			_ = unix.Truncate(img, fi.Size()) // give back what was allocated past the old size
			return err
		}
		_, err = block.Refresh(img)
		return err
	}
	return m.eng.Resize(m.volDir(v.ID), size)
}

// NodeExpand makes the node side see volume id's recorded size (CSI
// NodeExpandVolume): the loop device of a block volume is refreshed, the
// qgroup limit of a btrfs volume re-applied. volumePath must exist. It
// returns the capacity in bytes. It holds the volume (a read hold), so an
// expansion recorded meanwhile cannot be undone by this call re-applying
// the size it read before. Errors: contract.ErrNotFound, contract.ErrBusy (an expansion or
// delete is in progress).
func (m *Manager) NodeExpand(id, volumePath string) (int64, error) {
	unlock, err := m.lock(id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	v, err := m.Resolve(id)
	if err != nil {
		return 0, err
	}
	release, err := m.holds.read(v.ID, "a node expansion")
	if err != nil {
		return 0, err
	}
	defer release()
	if v, err = m.Get(v.ID); err != nil { // as of the hold
		return 0, err
	}
	if !filepath.IsAbs(volumePath) {
		return 0, fmt.Errorf("%w: volume_path %q is not an absolute path", contract.ErrNotFound, volumePath)
	}
	if _, err := os.Lstat(volumePath); err != nil {
		return 0, fmt.Errorf("%w: volume_path %q: %v", contract.ErrNotFound, volumePath, err)
	}
	if err := m.resizeData(v, v.CapacityBytes); err != nil {
		return 0, err
	}
	return v.CapacityBytes, nil
}

// Health is a volume's condition (CSI VolumeHealth).
type Health struct {
	// Problems is empty for a healthy volume.
	Problems []Problem
}

// Problem is one abnormal condition.
type Problem struct {
	// Kind is "Inaccessible", "Degraded" or "DataLoss".
	Kind    string
	Reason  string // CamelCase
	Message string
}

// Health checks volume id's data: missing data (DataLoss), and for the dir
// engine usage beyond the capacity (Degraded). Errors: contract.ErrNotFound.
func (m *Manager) Health(id string) (Health, error) {
	v, err := m.Resolve(id)
	if err != nil {
		return Health{}, err
	}
	var h Health
	p := m.dataPath(v)
	fi, err := os.Lstat(p)
	if err != nil {
		h.Problems = append(h.Problems, Problem{Kind: "DataLoss", Reason: "DataMissing", Message: fmt.Sprintf("volume data %s is missing: %v", p, err)})
		return h, nil
	}
	if v.AccessType == contract.AccessBlock {
		if fi.Size() < v.CapacityBytes {
			h.Problems = append(h.Problems, Problem{Kind: "Degraded", Reason: "ImageTooSmall", Message: fmt.Sprintf("image is %d bytes, volume size is %d", fi.Size(), v.CapacityBytes)})
		}
		return h, nil
	}
	if !m.eng.Enforced() || v.Engine == engine.Dir {
		used, _, err := engine.DiskUsage(p)
		if err == nil && used > v.CapacityBytes {
			h.Problems = append(h.Problems, Problem{Kind: "Degraded", Reason: "OverCapacity",
				Message: fmt.Sprintf("volume uses %d bytes, more than its capacity of %d bytes (the dir engine does not enforce capacity)", used, v.CapacityBytes)})
		}
	}
	return h, nil
}
