// Package volume is localdir's node-local data plane: it owns one data root
// and keeps there the volumes (a directory each, for the dir engine), their
// durable records (pkg/state) and the capacity accounting. It also performs
// the node-side mounts (stage, publish) on the paths the CO passes.
//
// Layout of the data root:
//
//	<root>/state.db        durable records (pkg/state)
//	<root>/volumes/<id>/   one directory per mount volume (dir engine)
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
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/state"
)

// Config configures a Manager.
type Config struct {
	// DataRoot is the directory holding everything the manager stores. It is
	// created (mode 0700) if missing; its parent must exist.
	DataRoot string
	// CapacityBytes caps the bytes that volumes may reserve in total; 0 means
	// the size of the filesystem holding DataRoot.
	CapacityBytes int64
}

// Manager is the data plane of one data root. Its methods are safe for
// concurrent use; callers serialize calls on the same volume (pkg/driver
// does, with per-id and per-name locks).
type Manager struct {
	root    string // absolute, symlinks resolved
	volRoot string
	cfg     Config
	st      *state.Store

	mu        sync.Mutex // guards allocated only; held for arithmetic, never across I/O
	allocated int64      // sum of CapacityBytes of all recorded volumes, plus reservations
}

// Open prepares the data root, opens its state file and finishes or rolls
// back work a crash interrupted: volume directories that no committed record
// claims (an unacknowledged create, or a delete whose record was already
// removed) are deleted.
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
	m := &Manager{root: root, volRoot: filepath.Join(root, "volumes"), cfg: cfg}
	if err := os.Mkdir(m.volRoot, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create %s: %w", m.volRoot, err)
	}
	statePath := filepath.Join(root, state.FileName)
	if _, err := os.Stat(statePath); errors.Is(err, os.ErrNotExist) {
		if n := countIDs(m.volRoot, ValidVolumeID); n > 0 {
			return nil, fmt.Errorf("state file %s is missing but %s holds %d volume(s); refusing to start with empty state. "+
				"Restore the state file from a backup, or move the volume directories away if they are not needed", statePath, m.volRoot, n)
		}
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

// Probe checks that the data root is usable and the state file readable.
func (m *Manager) Probe() error {
	if err := unix.Access(m.volRoot, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("data root %s not writable: %w", m.volRoot, err)
	}
	return m.st.View(func(*state.Tx) error { return nil })
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

func (m *Manager) recover() error {
	known := map[string]bool{}
	var total int64
	err := m.st.View(func(tx *state.Tx) error {
		return tx.ForEachVolume("", func(v *state.Volume) bool {
			known[v.ID] = true
			total += v.CapacityBytes
			return true
		})
	})
	if err != nil {
		return err
	}
	m.allocated = total
	ents, err := os.ReadDir(m.volRoot)
	if err != nil {
		return err
	}
	for _, e := range ents {
		id := e.Name()
		if !ValidVolumeID(id) {
			klog.InfoS("Ignoring unknown entry in data root", "path", filepath.Join(m.volRoot, id))
			continue
		}
		if known[id] {
			continue
		}
		dir := m.volDir(id)
		if busy, _ := m.mountedAnywhere(dir); busy {
			klog.InfoS("Unclaimed volume directory is mounted; leaving it", "path", dir)
			continue
		}
		klog.InfoS("Removing volume directory without a committed record (interrupted create or delete)", "volumeID", id, "path", dir)
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("roll back %s: %w", dir, err)
		}
	}
	return nil
}

// volDir is the data directory of a mount volume. It panics on an id that
// does not match the volume id pattern: callers validate first, and a path
// must never be built from anything else.
func (m *Manager) volDir(id string) string {
	if !ValidVolumeID(id) {
		panic(fmt.Sprintf("volume: path requested for invalid id %q", id))
	}
	return filepath.Join(m.volRoot, id)
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
	// min(Total - Allocated, Free), never negative.
	Available int64
}

// Capacity reports the data root's capacity (statfs(2) on the data root).
func (m *Manager) Capacity() (CapacityInfo, error) {
	m.mu.Lock()
	alloc := m.allocated
	m.mu.Unlock()
	return m.capacityWith(alloc)
}

func (m *Manager) capacityWith(alloc int64) (CapacityInfo, error) {
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
	ci.Available = min(ci.Total-alloc, ci.Free)
	if ci.Available < 0 {
		ci.Available = 0
	}
	return ci, nil
}

// reserve takes n bytes of capacity or fails with ErrNoSpace.
func (m *Manager) reserve(n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	ci, err := m.capacityWith(m.allocated)
	if err != nil {
		return err
	}
	if n > ci.Available {
		return fmt.Errorf("%w: %d bytes requested, %d available on node data root", ErrNoSpace, n, ci.Available)
	}
	m.allocated += n
	return nil
}

func (m *Manager) release(n int64) {
	m.mu.Lock()
	m.allocated -= n
	m.mu.Unlock()
}

// CreateSpec describes a new volume.
type CreateSpec struct {
	// Name is the CSI name (stored, never used in a path).
	Name string
	// SizeBytes is the capacity to reserve, in bytes (> 0).
	SizeBytes int64
	// AccessType is state.AccessMount or state.AccessBlock.
	AccessType string
	// Parameters are stored with the record.
	Parameters map[string]string
	// DirMode is the permission of the volume's root directory (chmod(2)
	// bits, e.g. 0o2770).
	DirMode uint32
}

// Create makes a new volume and commits its record durably before it
// returns. On any failure nothing is left behind: no directory, no record,
// no reserved capacity. Errors: ErrNoSpace, ErrExists (name taken by a
// concurrent create), ErrInvalid.
func (m *Manager) Create(spec CreateSpec) (*state.Volume, error) {
	if spec.SizeBytes <= 0 {
		return nil, fmt.Errorf("%w: size %d", ErrInvalid, spec.SizeBytes)
	}
	if spec.AccessType != state.AccessMount {
		return nil, fmt.Errorf("%w: access type %q is not supported", ErrInvalid, spec.AccessType)
	}
	if err := m.reserve(spec.SizeBytes); err != nil {
		return nil, err
	}
	id := NewVolumeID()
	dir := m.volDir(id)
	fail := func(err error) (*state.Volume, error) {
		_ = os.RemoveAll(dir)
		m.release(spec.SizeBytes)
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fail(mapNoSpace(fmt.Errorf("create volume directory: %w", err)))
	}
	if err := unix.Chmod(dir, spec.DirMode); err != nil {
		return fail(fmt.Errorf("chmod volume directory: %w", err))
	}
	v := &state.Volume{
		ID:            id,
		Name:          spec.Name,
		CapacityBytes: spec.SizeBytes,
		AccessType:    spec.AccessType,
		Parameters:    spec.Parameters,
		Engine:        "dir",
		CreatedAt:     time.Now().UTC().Truncate(time.Second),
	}
	err := m.st.Update(func(tx *state.Tx) error {
		if spec.Name != "" && tx.VolumeIDByName(spec.Name) != "" {
			return fmt.Errorf("%w: volume name %q", ErrExists, spec.Name)
		}
		return tx.PutVolume(v)
	})
	if err != nil {
		return fail(mapNoSpace(err))
	}
	return v, nil
}

func mapNoSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	}
	return err
}

// LookupByName returns the volume created for a CSI name, or nil.
func (m *Manager) LookupByName(name string) (*state.Volume, error) {
	var v *state.Volume
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

// Get returns the volume with this id. Errors: ErrNotFound (also for any id
// that is not of the driver's shape).
func (m *Manager) Get(id string) (*state.Volume, error) {
	if !ValidVolumeID(id) {
		return nil, fmt.Errorf("%w: volume %q", ErrNotFound, id)
	}
	var v *state.Volume
	err := m.st.View(func(tx *state.Tx) error {
		var err error
		v, err = tx.Volume(id)
		return err
	})
	if err == nil && v == nil {
		err = fmt.Errorf("%w: volume %q", ErrNotFound, id)
	}
	return v, err
}

// List returns up to limit volumes (all when limit <= 0) whose ids sort
// after `after`, in id order, and the id to continue after ("" at the end).
func (m *Manager) List(after string, limit int) ([]*state.Volume, string, error) {
	var out []*state.Volume
	next := ""
	err := m.st.View(func(tx *state.Tx) error {
		return tx.ForEachVolume(after, func(v *state.Volume) bool {
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
// data. Deleting an unknown id succeeds. Errors: ErrPrecondition when the
// volume is mounted anywhere on this node or something is mounted inside it.
func (m *Manager) Delete(id string) error {
	if !ValidVolumeID(id) {
		return nil
	}
	v, err := m.Get(id)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	dir := m.volDir(id)
	busy, err := m.mountedAnywhere(dir)
	if err != nil {
		return err
	}
	if busy {
		return fmt.Errorf("%w: volume %s is still mounted (staged or published); unpublish and unstage it first", ErrPrecondition, id)
	}
	if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(id) }); err != nil {
		return err
	}
	m.release(v.CapacityBytes)
	// The record is gone, so a crash from here on is finished by recover().
	if err := os.RemoveAll(dir); err != nil {
		klog.ErrorS(err, "Volume record deleted but data removal failed; it will be retried at restart", "volumeID", id, "path", dir)
	}
	return nil
}

// Condition describes a volume's health (CSI VolumeCondition).
type Condition struct {
	Abnormal bool
	Message  string
}

// Condition checks that the volume's data exists. Errors: ErrNotFound.
func (m *Manager) Condition(id string) (Condition, error) {
	v, err := m.Get(id)
	if err != nil {
		return Condition{}, err
	}
	if _, err := os.Lstat(m.volDir(v.ID)); err != nil {
		return Condition{Abnormal: true, Message: fmt.Sprintf("volume data is missing: %v", err)}, nil
	}
	return Condition{Message: "volume data present"}, nil
}
