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
	"github.com/localdir-csi/localdir/pkg/volume/cgroup"
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
	Engine contract.Engine
	// Mounter does the node mounts and answers what is mounted where
	// (stage, publish, delete's in-use check); nil means mount.New(), the
	// real one. Unit tests give a mount.Fake.
	Mounter mount.Interface
	// CgroupRoot is where the node's cgroup hierarchy is mounted (normally
	// /sys/fs/cgroup), for the I/O limits and freezes of the pods that use
	// volumes (pods.go); "" means none: a volume with I/O limits cannot be
	// published for a pod, nor a volume a pod uses join a group snapshot.
	CgroupRoot string
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
	locks     *keylock.Set      // the per-volume lock (locks.go)
	mnt       mount.Interface   // node mounts and the mount table
	cg        *cgroup.Hierarchy // pod cgroups (nil: Config.CgroupRoot is "")
	ioKick    chan struct{}     // wakes RunIOLimits

	mu sync.Mutex // guards use, measuring and measuredAt; held for arithmetic, never across I/O
	// use is the size of every recorded volume (and of creates and
	// expansions in progress) with its last measured use, by volume_id:
	// what Capacity and reserve account (capacity.go).
	use        map[string]volUse
	measuring  bool      // a measureUse is running
	measuredAt time.Time // when the last measureUse ended
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
		use:       map[string]volUse{},
		locks:     keylock.New(),
		mnt:       cfg.Mounter,
		ioKick:    make(chan struct{}, 1),
	}
	if cfg.CgroupRoot != "" {
		if m.cg, err = cgroup.Open(cfg.CgroupRoot); err != nil {
			return nil, err
		}
	}
	if m.mnt == nil {
		m.mnt = mount.New()
	}
	for _, d := range []string{m.volRoot, m.blockRoot, m.snapRoot, m.lostRoot, filepath.Join(root, frozenDir)} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	// First of all: a pod's filesystem a killed driver left frozen must not
	// wait for anything that could stop this start.
	m.thawFrozen()
	statePath := filepath.Join(root, state.FileName)
	if _, err := os.Stat(statePath); errors.Is(err, os.ErrNotExist) {
		n := countIDs(m.volRoot, contract.ValidVolumeID) + countIDs(m.blockRoot, validImage(contract.ValidVolumeID)) +
			countIDs(m.snapRoot, contract.ValidSnapshotID) + countIDs(m.snapRoot, validImage(contract.ValidSnapshotID))
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
	m.measuring = true
	m.measureUse()
	return m, nil
}

// Close closes the state file.
func (m *Manager) Close() error { return m.st.Close() }

// Root is the resolved data root.
func (m *Manager) Root() string { return m.root }

// Engine is the name of the engine new mount volumes are made with.
func (m *Manager) Engine() contract.Engine { return m.eng.Name() }

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
	if v.Image() {
		return m.imagePath(v.ID)
	}
	return m.volDir(v.ID)
}

func mustVolumeID(id string) {
	if !contract.ValidVolumeID(id) {
		panic(fmt.Sprintf("volume: path requested for invalid volume id %q", id))
	}
}

// Delete removes a volume: its record is removed durably first, then its
// data. Deleting an unknown id succeeds. Snapshots of the volume are
// independent copies and stay usable. Errors: contract.ErrPrecondition when the
// volume is mounted or attached anywhere on this node, contract.ErrBusy while a
// clone, snapshot or stage reads it or another call changes it.
func (m *Manager) Delete(id string) error {
	if !contract.ValidVolumeID(id) {
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
	m.unreserve(id, v.CapacityBytes)
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
	if v.Image() {
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
	if v.FsType != "" {
		// The device has its new size; the filesystem grows online where
		// it is mounted (volumePath: a publish or the staging path).
		dev, err := block.FindMode(m.imagePath(v.ID), false)
		if err != nil {
			return 0, err
		}
		if dev == "" {
			return 0, fmt.Errorf("%w: image volume %s is not staged on this node", contract.ErrPrecondition, v.ID)
		}
		if ok, err := m.mnt.HoldsFS(volumePath, dev); err != nil || !ok {
			return 0, fmt.Errorf("%w: volume_path %q is not a mount of volume %s", contract.ErrNotFound, volumePath, v.ID)
		}
		if err := m.mnt.ResizeFS(dev, volumePath); err != nil {
			return 0, err
		}
	}
	return v.CapacityBytes, nil
}
