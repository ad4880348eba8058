package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/localdir-csi/localdir/pkg/state"
)

func openTest(t *testing.T, root string) *Manager {
	t.Helper()
	m, err := Open(Config{DataRoot: root, CapacityBytes: 1 << 30, Engine: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func create(t *testing.T, m *Manager, name string) *state.Volume {
	t.Helper()
	v, err := m.Create(CreateSpec{Name: name, SizeBytes: 1 << 20, AccessType: state.AccessMount, DirMode: 0o755})
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
		v, err := m.Create(CreateSpec{ID: id, Name: "same", SizeBytes: 1 << 20, AccessType: state.AccessMount, DirMode: 0o755})
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
	if _, err := m.Get(gone.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted volume back: %v", err)
	}
}
