package volume

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// landing is how new data (a volume, a snapshot, a group's snapshots) comes
// to exist: written under its .creating- name, its record committed, then
// renamed to its final name, so recovery removes data nobody was told of and
// renames data whose record exists.
type landing struct {
	// what names the data in logs ("a create", "a snapshot").
	what string
	// dsts are the final paths.
	dsts []string
	// write makes the data at tmps (one per dst), synced to disk.
	write func(tmps []string) error
	// commit records the data, in one transaction.
	commit func(tx *state.Tx) error
	// uncommit takes the records back when a rename fails; nil keeps them
	// and the next start finishes the renames.
	uncommit func(tx *state.Tx) error
}

// errLandsAtStart marks a landing whose records stay committed although a
// rename failed: its data gets its final name at the next start.
var errLandsAtStart = errors.New("it is finished at restart")

// land runs l. A failed write or commit (or rename, once uncommit took the
// records back) removes what was written; otherwise a failed rename wraps
// errLandsAtStart.
func (m *Store) land(l landing) error {
	tmps := make([]string, len(l.dsts))
	for i, d := range l.dsts {
		tmps[i] = inFlight(creatingPrefix, d)
	}
	remove := func(err error) error {
		for _, t := range tmps {
			if rerr := engine.Remove(t); rerr != nil {
				klog.ErrorS(rerr, "Could not remove the data of a failed "+l.what+"; it is removed at restart", "path", t)
			}
		}
		return mapNoSpace(err)
	}
	// A failed earlier attempt for the same id (cluster mode retries a
	// create under its id) may have left data; nobody was told of it.
	for _, t := range tmps {
		if err := engine.Remove(t); err != nil {
			return remove(err)
		}
	}
	if err := l.write(tmps); err != nil {
		return remove(err)
	}
	if err := m.st.Update(l.commit); err != nil {
		return remove(err)
	}
	for i, t := range tmps {
		err := unix.Renameat2(unix.AT_FDCWD, t, unix.AT_FDCWD, l.dsts[i], unix.RENAME_NOREPLACE)
		if err == nil {
			continue
		}
		err = fmt.Errorf("rename %s to %s: %w", t, l.dsts[i], err)
		if l.uncommit == nil || i > 0 {
			return fmt.Errorf("%w: %w", err, errLandsAtStart)
		}
		if rerr := m.st.Update(l.uncommit); rerr != nil {
			return fmt.Errorf("%w; and its record could not be taken back (%v): %w", err, rerr, errLandsAtStart)
		}
		return remove(err)
	}
	return nil
}

// unland removes the data at path that the record of kind id acknowledges,
// land's reverse: the data is renamed to its .deleting- name (trash), the
// record deleted (uncommit), then the data removed. A crash in between is
// rolled back (record kept) or finished (record gone) at start; a failed
// commit puts the data back.
func (m *Store) unland(kind, id, path string, uncommit func(tx *state.Tx) error) error {
	t, err := m.trash(path)
	if err != nil {
		return err
	}
	if err := m.st.Update(uncommit); err != nil {
		_ = os.Rename(t, path)
		return err
	}
	if err := engine.Remove(t); err != nil {
		klog.ErrorS(err, "Record deleted but data removal failed; it is retried at restart", "kind", kind, "id", id)
	}
	return nil
}
