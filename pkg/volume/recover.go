package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Prefixes of data in flight, in its final name's directory (a rename there
// never crosses filesystems and works for read-only btrfs subvolumes).
const (
	// creatingPrefix marks data a create or snapshot is still writing; its
	// record is committed under this name and the rename follows.
	creatingPrefix = ".creating-"
	// deletingPrefix marks data renamed before its record is deleted.
	deletingPrefix = ".deleting-"
)

// Leftovers lists what Recover could not put in order; reported in the log,
// a metric and LocalNode status.recoveryProblems.
func (m *Store) Leftovers() []contract.Leftover {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]contract.Leftover(nil), m.leftovers...)
}

func (m recovery) leftover(path string, err error) {
	klog.ErrorS(err, "Data left by an interrupted operation could not be recovered; it is kept and reported, the driver serves everything else", "path", path)
	m.mu.Lock()
	m.leftovers = append(m.leftovers, contract.Leftover{Path: path, Problem: err.Error()})
	m.mu.Unlock()
}

// recovery is one start's putting in order of the Store's data root
// (Store.Recover).
type recovery struct{ *Store }

// recover puts the data root in order after a crash, before anything is
// served: .creating-<id> is renamed to <id> when its record exists (else
// removed: nobody was told of it); .deleting-<id> is rolled back when its
// record exists, else removed; <id> without a record is moved to orphaned/,
// never deleted; data smaller than its record grows; ephemeral volumes no
// longer mounted are deleted. No entry stops the start (Leftovers); only an
// unreadable state file or data root fails.
func (m recovery) recover() error {
	known := map[string]bool{}
	var vols, ephemeral []*contract.Volume
	err := m.st.View(func(tx *state.Tx) error {
		if err := tx.ForEachVolume("", func(v *contract.Volume) bool {
			known[v.ID] = true
			m.use[v.ID] = volUse{size: v.CapacityBytes}
			vols = append(vols, v)
			if v.Ephemeral {
				ephemeral = append(ephemeral, v)
			}
			return true
		}); err != nil {
			return err
		}
		return tx.ForEachSnapshot("", func(s *contract.Snapshot) bool {
			known[s.ID] = true
			return true
		})
	})
	if err != nil {
		return err
	}
	for _, dir := range []string{m.volRoot, m.blockRoot, m.snapRoot} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range ents {
			m.recoverEntry(dir, e.Name(), known)
		}
	}
	m.removeSendCopies()
	for _, v := range vols {
		grew, err := m.finishGrowth(v)
		switch {
		case err != nil:
			m.leftover(m.dataPath(v), fmt.Errorf("grow volume %s to the %d bytes of its record (an expansion a crash cut short): %w", v.ID, v.CapacityBytes, err))
		case grew:
			klog.InfoS("Finished an interrupted expansion: the data grew to the size of its record", "volumeID", v.ID, "size", v.CapacityBytes)
		}
	}
	for _, v := range ephemeral {
		if busy, _ := m.node.InUse(m.volDir(v.ID)); busy {
			continue
		}
		klog.InfoS("Removing ephemeral volume that is no longer published (node restarted)", "volumeID", v.ID, "ephemeralID", v.EphemeralID)
		if err := m.Delete(v.ID); err != nil {
			m.leftover(m.volDir(v.ID), fmt.Errorf("remove ephemeral volume %s: %w", v.ID, err))
		}
	}
	return nil
}

// entryID returns the id an entry name of the data root stands for, and
// its in-flight prefix ("" for none); ok is false for foreign names.
func entryID(name string) (id, prefix string, ok bool) {
	for _, p := range []string{creatingPrefix, deletingPrefix} {
		if rest, cut := strings.CutPrefix(name, p); cut {
			prefix, name = p, rest
			break
		}
	}
	id = strings.TrimSuffix(name, ".img")
	return id, prefix, contract.ValidVolumeID(id) || contract.ValidSnapshotID(id)
}

func (m recovery) recoverEntry(dir, name string, known map[string]bool) {
	p := filepath.Join(dir, name)
	id, prefix, ok := entryID(name)
	if !ok {
		klog.InfoS("Ignoring unknown entry in data root", "path", p)
		return
	}
	final := filepath.Join(dir, strings.TrimPrefix(name, prefix))
	switch {
	case prefix == creatingPrefix && known[id] && !exists(final):
		klog.InfoS("Finishing an interrupted create: its record was committed", "id", id)
		if err := os.Rename(p, final); err != nil {
			m.leftover(p, fmt.Errorf("finish the create of %s: %w", id, err))
		}
	case prefix == creatingPrefix:
		klog.InfoS("Removing the data of an interrupted create that was never acknowledged", "id", id, "path", p)
		m.removeLeftover(p)
	case prefix == deletingPrefix && known[id] && !exists(final):
		klog.InfoS("Rolling back an interrupted delete", "id", id)
		if err := unix.Renameat2(unix.AT_FDCWD, p, unix.AT_FDCWD, final, unix.RENAME_NOREPLACE); err != nil {
			m.leftover(p, fmt.Errorf("roll back the delete of %s: %w", id, err))
		}
	case prefix == deletingPrefix:
		// No record, or one whose data is at its final name: an earlier volume
		// of the same id (cluster ids come from CSI names) whose removal stopped.
		klog.InfoS("Finishing an interrupted delete", "id", id, "path", p)
		m.removeLeftover(p)
	case known[id]:
	default:
		m.moveAside(p, id)
	}
}

// removeLeftover removes unacknowledged data at p (detaching a loop device
// an image may still have).
func (m recovery) removeLeftover(p string) {
	if strings.HasSuffix(p, ".img") {
		if err := m.node.Detach(p); err != nil {
			m.leftover(p, fmt.Errorf("detach its loop device: %w", err))
			return
		}
	}
	if err := engine.Remove(p); err != nil {
		m.leftover(p, fmt.Errorf("remove: %w", err))
	}
}

// moveAside moves data no record claims into orphaned/: its origin is
// unknown (an older state file restored, say), so it is never deleted.
func (m recovery) moveAside(p, id string) {
	if busy, _ := m.node.InUse(p); busy {
		m.leftover(p, errors.New("data without a record is mounted; it is left where it is"))
		return
	}
	if strings.HasSuffix(p, ".img") {
		if err := m.node.Detach(p); err != nil {
			m.leftover(p, fmt.Errorf("data without a record: detach its loop device: %w", err))
			return
		}
	}
	lost := m.lostPath(filepath.Base(p))
	if err := engine.Move(p, lost); err != nil {
		m.leftover(p, fmt.Errorf("data without a record: move it to %s: %w", lost, err))
		return
	}
	klog.InfoS("Data without a committed record (a state file older than the data): moved aside, not deleted; "+
		"inspect it and remove it by hand when it is not needed", "id", id, "from", p, "to", lost)
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// lostPath is where unclaimed data named name goes in orphaned/, with a
// numeric suffix when an earlier start left the name taken.
func (m recovery) lostPath(name string) string {
	p := filepath.Join(m.lostRoot, name)
	for i := 1; ; i++ {
		if !exists(p) {
			return p // free (any other error shows in the rename)
		}
		p = filepath.Join(m.lostRoot, fmt.Sprintf("%s.%d", name, i))
	}
}

func inFlight(prefix, p string) string {
	return filepath.Join(filepath.Dir(p), prefix+filepath.Base(p))
}

// trash renames the data at p to its .deleting- name before its record goes,
// so a crash leaves the record with its data or neither; it returns that path.
func (m *Store) trash(p string) (string, error) {
	t := inFlight(deletingPrefix, p)
	if err := os.Rename(p, t); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("mark %s as deleting: %w", p, err)
	}
	// The rename is durable before the record's removal: else a power loss
	// could keep the removal and lose the rename (data without a record).
	if err := syncDir(filepath.Dir(p)); err != nil {
		_ = os.Rename(t, p)
		return "", err
	}
	return t, nil
}
