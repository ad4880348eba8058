// Package volume is localdir's node-local storage: it owns one data root with
// the volumes, snapshots, their durable records (pkg/state) and the capacity
// accounting, and puts it in order after a crash (Recover). A volume's use on
// the node (mounts, loop devices, pods) is pkg/publish's, asked through Node.
//
// Layout of the data root:
//
//	<root>/state.db              durable records (pkg/state)
//	<root>/volumes/<id>/         a mount volume (directory or btrfs subvolume)
//	<root>/block/<id>.img        an image volume (raw block, or a filesystem image; allocated to its size)
//	<root>/snapshots/<sid>/      a snapshot of a directory volume
//	<root>/snapshots/<sid>.img   a snapshot of an image volume
//	<root>/frozen/               the node side's freeze records (pkg/publish)
//	<dir>/.creating-<name>       data a create or snapshot is still writing (recover.go)
//	<dir>/.deleting-<name>       data of a delete in flight (recover.go)
//	<root>/orphaned/             data no record claimed at start: moved aside, never deleted
//	<root>/sending/<n>           a point-in-time copy of a volume being sent to another node (transfer.go), removed at start
//
// Every path below the root is built from a driver-issued id checked against
// contract.ValidVolumeID / ValidSnapshotID first. Nothing outside the root is
// created, changed or removed.
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
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// Config configures a Store.
type Config struct {
	// DataRoot is the directory holding everything the store keeps. It is
	// created (mode 0700) if missing; its parent must exist.
	DataRoot string
	// CapacityBytes caps what volumes may reserve; 0: DataRoot's filesystem size.
	CapacityBytes int64
	// Engine is engine.Auto (default), engine.Dir or engine.Btrfs.
	Engine contract.Engine
}

// Node is what the Store asks of the node side (pkg/publish's Publisher).
type Node interface {
	// CheckUnused fails with contract.ErrPrecondition when v is mounted or
	// attached on this node.
	CheckUnused(v *contract.Volume) error
	// Freeze stops the writes to image volume v's filesystem for a copy of
	// its image; the thaw fails when the freeze did not last the copy.
	Freeze(v *contract.Volume) (thaw func() error, err error)
	// FreezeGroup stops the writes to all of vols at one point in time
	// (contract.ErrPrecondition when a writer cannot be stopped).
	FreezeGroup(vols []*contract.Volume) (thaw func() error, err error)
	// Refresh makes the loop devices attached to image see its new size.
	Refresh(image string) error
	// Detach detaches every loop device attached to image.
	Detach(image string) error
	// InUse reports whether path (a volume's data) is mounted anywhere.
	InUse(path string) (bool, error)
	// ApplyMutable applies the node's part of a modify of volume v.
	ApplyMutable(v *contract.Volume, mut contract.Mutable, merged map[string]string) error
	// HoldKey keeps key id in the data root's keyring until release, for
	// a copy of an encrypted directory volume: present says whether it is
	// there (release is nil when not).
	HoldKey(id fscrypt.Identifier) (release func(), present bool, err error)
}

// Store keeps the volumes and snapshots of one data root; its methods are
// safe for concurrent use, and Recover must run before any other.
type Store struct {
	layout
	cfg   Config
	eng   engine.Engine
	st    *state.Store
	holds *holdSet
	locks *keylock.Set // the per-volume lock (locks.go)
	node  Node         // set by Recover
	snaps *Snapshots
	acct  accounting

	mu sync.Mutex // guards use, measuring and measuredAt; held for arithmetic, never across I/O
	// use is the size and last measured use of every recorded volume, and of
	// creates and expansions in progress, by volume_id (capacity.go).
	use        map[string]volUse
	measuring  bool      // a measureUse is running
	measuredAt time.Time // when the last measureUse ended
	// leftovers is what Recover could not put in order.
	leftovers []contract.Leftover
}

// Open prepares the data root and opens its state file. It fails when the
// state file is damaged (state.ErrCorrupt) or missing while volume data
// exists: empty state would orphan every volume, so a person decides.
func Open(cfg Config) (*Store, error) {
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
	m := &Store{
		layout: newLayout(root),
		cfg:    cfg,
		holds:  newHolds(),
		use:    map[string]volUse{},
		locks:  keylock.New(),
	}
	m.snaps = &Snapshots{m}
	m.acct = accounting{m}
	for _, d := range []string{m.volRoot, m.blockRoot, m.snapRoot, m.lostRoot, m.sendRoot} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
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
	if m.st, err = state.Open(statePath); err != nil {
		return nil, err
	}
	return m, nil
}

// Recover finishes or rolls back what a crash interrupted (recover.go) and
// starts measuring use; node is the Store's node side from then on. Only the
// state file's error fails it (leftovers: Leftovers).
func (m *Store) Recover(node Node) error {
	m.node = node
	if err := (recovery{m}).recover(); err != nil {
		return err
	}
	m.mu.Lock()
	m.measuring = true
	m.mu.Unlock()
	m.acct.measureUse()
	return nil
}

// Snapshots is the store's snapshot side.
func (m *Store) Snapshots() *Snapshots { return m.snaps }

// Close closes the state file.
func (m *Store) Close() error { return m.st.Close() }

// Root is the resolved data root.
func (m *Store) Root() string { return m.root }

// Engine is the name of the engine new mount volumes are made with.
func (m *Store) Engine() contract.Engine { return m.eng.Name() }

// Probe checks that the data root is usable and the state file readable.
func (m *Store) Probe() error {
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

// DataPath is where volume v's data lives on this node.
func (m *Store) DataPath(v *contract.Volume) string { return m.dataPath(v) }

// Delete removes a volume, record first, then data; an unknown id succeeds.
// Errors: contract.ErrPrecondition (mounted or attached), contract.ErrBusy.
func (m *Store) Delete(id string) error {
	if !contract.ValidVolumeID(id) {
		return nil
	}
	release, err := m.lockChange("a delete", id)
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
	if err := m.node.CheckUnused(v); err != nil {
		return err
	}
	if err := m.unland("volume", id, m.dataPath(v), func(tx *state.Tx) error { return tx.DeleteVolume(id) }); err != nil {
		return err
	}
	m.acct.unreserve(id, v.CapacityBytes)
	klog.V(2).InfoS("Volume deleted", "volumeID", id)
	return nil
}
