package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

func openTest(t *testing.T, root string) *Store {
	t.Helper()
	m, err := Open(Config{DataRoot: root, CapacityBytes: 1 << 30, Engine: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Recover(idleNode{}); err != nil {
		t.Fatal(err)
	}
	return m
}

func create(t *testing.T, m *Store, name string) *contract.Volume {
	t.Helper()
	v, err := m.Create(contract.CreateSpec{Name: name, SizeBytes: 1 << 20, AccessType: contract.AccessMount, DirMode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.volDir(v.ID), "f"), []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	return v
}

// Data no record claims — an interrupted create, or volumes newer than a
// state.db restored from a backup — is moved aside at start, never deleted.
func TestUnclaimedDataIsMovedAsideNotDeleted(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	v := create(t, m, "kept")
	lost := create(t, m, "lost")
	// Lose the record of "lost", as restoring an older state file would.
	if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(lost.ID) }); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m = openTest(t, root)
	defer m.Close()
	if _, err := os.Stat(filepath.Join(root, "volumes", lost.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unclaimed volume still in volumes/: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(root, "orphaned", lost.ID, "f"))
	if err != nil || string(got) != "lost" {
		t.Fatalf("unclaimed data not kept in orphaned/: %q %v", got, err)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "volumes", v.ID, "f")); string(got) != "kept" {
		t.Fatalf("claimed volume changed: %q", got)
	}
}

// Cluster mode gives a retried create the id of its first attempt: data of
// the same id left unclaimed by two interrupted creates (a restore or a
// snapshot copy cut short twice) is moved aside twice, both kept, and the
// driver still starts.
func TestUnclaimedDataOfTheSameIDTwice(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	const id = "vol-0123456789abcdef0123456789abcdef"
	for i, content := range []string{"first", "second"} {
		m := openTest(t, root)
		if i > 0 {
			if _, err := os.Stat(filepath.Join(root, "orphaned", id, "f")); err != nil {
				t.Fatalf("the first attempt's data was not moved aside: %v", err)
			}
		}
		v, err := m.Create(contract.CreateSpec{ID: id, Name: "same", SizeBytes: 1 << 20, AccessType: contract.AccessMount, DirMode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.volDir(v.ID), "f"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		// The crash before the commit: no record.
		if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(v.ID) }); err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	m := openTest(t, root)
	defer m.Close()
	for p, want := range map[string]string{id: "first", id + ".1": "second"} {
		if got, err := os.ReadFile(filepath.Join(root, "orphaned", p, "f")); err != nil || string(got) != want {
			t.Errorf("orphaned/%s/f: %q %v, want %q", p, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "volumes", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("unclaimed volume still in volumes/: %v", err)
	}
}

// A delete interrupted after its data was marked but before the record went
// is rolled back; one interrupted after the record went is finished.
func TestInterruptedDeletesAreRolledBackOrFinished(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	back := create(t, m, "back")
	gone := create(t, m, "gone")
	if _, err := m.trash(m.volDir(back.ID)); err != nil { // crash before the commit
		t.Fatal(err)
	}
	if _, err := m.trash(m.volDir(gone.ID)); err != nil { // crash after the commit
		t.Fatal(err)
	}
	if err := m.st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(gone.ID) }); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m = openTest(t, root)
	defer m.Close()
	if got, err := os.ReadFile(filepath.Join(root, "volumes", back.ID, "f")); err != nil || string(got) != "back" {
		t.Fatalf("unacknowledged delete not rolled back: %q %v", got, err)
	}
	ents, _ := os.ReadDir(filepath.Join(root, "volumes"))
	if len(ents) != 1 || ents[0].Name() != back.ID {
		t.Fatalf("volumes/ after recovery: %v", ents)
	}
	if lost, _ := os.ReadDir(filepath.Join(root, "orphaned")); len(lost) != 0 {
		t.Fatalf("a committed delete's data went to orphaned/: %v", lost)
	}
	if _, err := m.Get(gone.ID); !errors.Is(err, contract.ErrNotFound) {
		t.Fatalf("deleted volume back: %v", err)
	}
}

// Data still being written when the driver was killed carries the
// .creating- prefix. At start, an entry whose record was committed is given
// its final name; one without a record was never acknowledged to anyone and
// is removed — not moved to orphaned/, which before grew with every create
// a kill interrupted (volumes, block images and snapshots alike).
func TestInterruptedCreatesAreFinishedOrRemoved(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	done := create(t, m, "committed")
	snap, err := m.Snapshots().Create(contract.SnapshotSpec{Name: "s", SourceVolumeID: done.ID})
	if err != nil {
		t.Fatal(err)
	}
	// The crashes after the commit, before the rename.
	if err := os.Rename(m.volDir(done.ID), inFlight(creatingPrefix, m.volDir(done.ID))); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(m.snapPath(snap), inFlight(creatingPrefix, m.snapPath(snap))); err != nil {
		t.Fatal(err)
	}
	// Crashes before the commit: data under the prefix, no record.
	unacked := []string{
		inFlight(creatingPrefix, m.volDir(contract.NewVolumeID())),
		inFlight(creatingPrefix, filepath.Join(root, "snapshots", contract.NewSnapshotID())),
	}
	for _, p := range unacked {
		if err := os.MkdirAll(filepath.Join(p, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	img := inFlight(creatingPrefix, m.imagePath(contract.NewVolumeID()))
	if err := os.WriteFile(img, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	unacked = append(unacked, img)
	m.Close()

	m = openTest(t, root)
	defer m.Close()
	if got, err := os.ReadFile(filepath.Join(m.volDir(done.ID), "f")); err != nil || string(got) != "committed" {
		t.Errorf("committed create not finished: %q %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(m.snapPath(snap), "f")); err != nil || string(got) != "committed" {
		t.Errorf("committed snapshot not finished: %q %v", got, err)
	}
	for _, p := range unacked {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("unacknowledged %s still there: %v", p, err)
		}
	}
	if lost, _ := os.ReadDir(filepath.Join(root, "orphaned")); len(lost) != 0 {
		t.Errorf("unacknowledged data went to orphaned/: %v", lost)
	}
	if l := m.Leftovers(); len(l) != 0 {
		t.Errorf("leftovers reported: %v", l)
	}
	for _, d := range []string{"volumes", "snapshots", "block"} {
		ents, _ := os.ReadDir(filepath.Join(root, d))
		for _, e := range ents {
			if e.Name() != done.ID && e.Name() != snap.ID {
				t.Errorf("%s/%s left after recovery", d, e.Name())
			}
		}
	}
}

// Case C34: an operation that reads a snapshot or volume holds it; a delete
// or expansion meanwhile fails with contract.ErrBusy and changes nothing, and a
// restore, clone or snapshot that finds its source being deleted fails with
// contract.ErrBusy instead of copying part of it. (Before, nothing held the source:
// a snapshot deleted during a restore left the restored volume with part of
// its files.)
func TestOperationsHoldWhatTheyRead(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	defer m.Close()
	v := create(t, m, "src")
	snap, err := m.Snapshots().Create(contract.SnapshotSpec{Name: "s", SourceVolumeID: v.ID})
	if err != nil {
		t.Fatal(err)
	}
	// A restore of snap and a clone or snapshot of v in progress.
	for _, reader := range []struct{ id, what string }{{snap.ID, "a restore"}, {v.ID, "a clone"}, {v.ID, "a snapshot"}} {
		release, err := m.holds.read(reader.id, reader.what)
		if err != nil {
			t.Fatal(err)
		}
		if reader.id == snap.ID {
			if err := m.Snapshots().Delete(snap.ID); !errors.Is(err, contract.ErrBusy) {
				t.Errorf("DeleteSnapshot during %s: %v, want contract.ErrBusy", reader.what, err)
			}
		} else {
			if err := m.Delete(v.ID); !errors.Is(err, contract.ErrBusy) {
				t.Errorf("Delete during %s: %v, want contract.ErrBusy", reader.what, err)
			}
			if _, err := m.Expand(v.ID, 2<<20); !errors.Is(err, contract.ErrBusy) {
				t.Errorf("Expand during %s: %v, want contract.ErrBusy", reader.what, err)
			}
		}
		release()
	}
	if _, err := m.Snapshots().Get(snap.ID); err != nil {
		t.Fatalf("snapshot gone after a refused delete: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(m.snapPath(snap), "f")); err != nil || string(got) != "src" {
		t.Fatalf("snapshot data after a refused delete: %q %v", got, err)
	}
	if got, _ := m.Get(v.ID); got == nil || got.CapacityBytes != 1<<20 {
		t.Fatalf("volume after a refused delete and expansion: %+v", got)
	}
	// A delete of snap (or of v) in progress: the readers are refused.
	release, err := m.holds.change(snap.ID, "a delete")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(contract.CreateSpec{Name: "r", SizeBytes: 1 << 20, AccessType: contract.AccessMount, SourceSnapshotID: snap.ID}); !errors.Is(err, contract.ErrBusy) {
		t.Errorf("restore during DeleteSnapshot: %v, want contract.ErrBusy", err)
	}
	release()
	release, err = m.holds.change(v.ID, "a delete")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(contract.CreateSpec{Name: "c", SizeBytes: 1 << 20, AccessType: contract.AccessMount, SourceVolumeID: v.ID}); !errors.Is(err, contract.ErrBusy) {
		t.Errorf("clone during Delete: %v, want contract.ErrBusy", err)
	}
	if _, err := m.Snapshots().Create(contract.SnapshotSpec{Name: "s2", SourceVolumeID: v.ID}); !errors.Is(err, contract.ErrBusy) {
		t.Errorf("snapshot during Delete: %v, want contract.ErrBusy", err)
	}
	release()
	for _, d := range []string{"volumes", "snapshots"} {
		if ents, _ := os.ReadDir(filepath.Join(root, d)); len(ents) != 1 {
			t.Errorf("%s after the refused calls: %v", d, ents)
		}
	}
	// Free again: both succeed.
	r, err := m.Create(contract.CreateSpec{Name: "r", SizeBytes: 1 << 20, AccessType: contract.AccessMount, SourceSnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(m.volDir(r.ID), "f")); err != nil || string(got) != "src" {
		t.Fatalf("restored data: %q %v", got, err)
	}
	if err := m.Snapshots().Delete(snap.ID); err != nil {
		t.Fatal(err)
	}
}

// An in-flight entry whose final name is already taken by the recorded data
// (cluster mode reuses an id: a delete of the earlier volume whose removal
// did not finish, or a create's copy left over) is the stale one: it is
// removed, and the recorded data is never replaced by it.
func TestStaleInFlightEntriesNeverReplaceRecordedData(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	v := create(t, m, "current")
	for _, prefix := range []string{creatingPrefix, deletingPrefix} {
		stale := inFlight(prefix, m.volDir(v.ID))
		if err := os.MkdirAll(stale, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(stale, "f"), []byte("stale"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	m = openTest(t, root)
	defer m.Close()
	if got, err := os.ReadFile(filepath.Join(m.volDir(v.ID), "f")); err != nil || string(got) != "current" {
		t.Fatalf("recorded data replaced by a stale in-flight entry: %q %v", got, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "volumes")); len(ents) != 1 {
		t.Fatalf("volumes/ after recovery: %v", ents)
	}
	if l := m.Leftovers(); len(l) != 0 {
		t.Fatalf("leftovers: %v", l)
	}
}

// TestCopiesOfAnInterruptedSendAreRemoved: what a Send killed mid-stream left
// in sending/ (its private copy of a volume) goes at the next start; the
// volumes stay.
func TestCopiesOfAnInterruptedSendAreRemoved(t *testing.T) {
	root := t.TempDir()
	m := openTest(t, root)
	v := create(t, m, "kept")
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(root, "sending", "vol-00000000000000000000000000000001")
	if err := os.MkdirAll(filepath.Join(left, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(left+".img", []byte("image"), 0o600); err != nil {
		t.Fatal(err)
	}
	m = openTest(t, root)
	if ents, err := os.ReadDir(filepath.Join(root, "sending")); err != nil || len(ents) != 0 {
		t.Errorf("sending/ after start: %v, %v; want empty", ents, err)
	}
	if _, err := m.Get(v.ID); err != nil {
		t.Errorf("volume %s after start: %v", v.ID, err)
	}
}
