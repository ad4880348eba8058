package state

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// crashCopy copies the state file and its log of a store that is still open
// (and idle) into a new directory, as a crash at this point would leave them
// on disk: every acknowledged change has been fdatasync'd to one of them.
func crashCopy(t *testing.T, s *Store) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), FileName)
	for _, p := range [][2]string{{s.path, dst}, {WALPath(s.path), WALPath(dst)}} {
		b, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// pendingKeys waits until the commit loop is idle (the checkpoint that may
// follow an acknowledged group is done) and returns the pending key count.
func pendingKeys(t *testing.T, s *Store) int {
	t.Helper()
	if err := s.Update(func(*Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pending.n
}

func boltVolumeCount(t *testing.T, path string) int {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := 0
	_ = db.View(func(tx *bolt.Tx) error { n = tx.Bucket(bucketVolumes).Stats().KeyN; return nil })
	return n
}

func allVolumes(t *testing.T, s *Store) []*Volume {
	t.Helper()
	var got []*Volume
	if err := s.View(func(tx *Tx) error {
		return tx.ForEachVolume("", func(v *Volume) bool { got = append(got, v); return true })
	}); err != nil {
		t.Fatal(err)
	}
	return got
}

// TestWALCrashReplay: changes acknowledged but not yet carried into the
// bbolt file are replayed from the log after a crash.
func TestWALCrashReplay(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	var want []*Volume
	for i := 0; i < 20; i++ {
		putT(t, s, testVolume(i))
		want = append(want, testVolume(i))
	}
	for _, i := range []int{3, 11} {
		if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(volID(i)) }); err != nil {
			t.Fatal(err)
		}
	}
	want = append(append(want[:3], want[4:11]...), want[12:]...)
	if !reflect.DeepEqual(allVolumes(t, s), want) {
		t.Fatal("reads before the crash do not show the changes")
	}
	copyPath := crashCopy(t, s)
	if n := boltVolumeCount(t, copyPath); n != 0 {
		t.Fatalf("test setup: the bbolt file already holds %d volumes (no log replay tested)", n)
	}
	c := openT(t, copyPath)
	if got := allVolumes(t, c); !reflect.DeepEqual(got, want) {
		t.Fatalf("after replay: %d volumes, want %d", len(got), len(want))
	}
	if id := nameOf(t, c, "pvc-3"); id != "" {
		t.Fatalf("deleted name maps to %q after replay", id)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Replayed and closed cleanly: the bbolt file alone holds everything.
	if n := boltVolumeCount(t, copyPath); n != len(want) {
		t.Fatalf("bbolt file holds %d volumes after a clean close, want %d", n, len(want))
	}
}

// TestWALTornTail: a record cut short by the crash (never acknowledged) is
// dropped; everything before it stays.
func TestWALTornTail(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	for i := 0; i < 5; i++ {
		putT(t, s, testVolume(i))
	}
	copyPath := crashCopy(t, s)
	// Damage the last record (the fifth, at block 4) as a torn write would.
	f, err := os.OpenFile(WALPath(copyPath), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("torn"), 4*walBlock+walHeader+10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c := openT(t, copyPath)
	defer c.Close()
	if got := allVolumes(t, c); len(got) != 4 || got[3].ID != volID(3) {
		t.Fatalf("after a torn last record: %d volumes, want the first 4", len(got))
	}
	// New changes continue after the replayed ones and survive a crash.
	putT(t, c, testVolume(100))
	c2 := openT(t, crashCopy(t, c))
	defer c2.Close()
	if got := allVolumes(t, c2); len(got) != 5 {
		t.Fatalf("after a second crash: %d volumes, want 5", len(got))
	}
}

// TestWALAfterCheckpoint: after checkpoints the log is overwritten from its
// start; older records left behind the new ones are never replayed, and a
// crash at any point loses nothing acknowledged.
func TestWALAfterCheckpoint(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	n := 0
	batch := func(k int) {
		t.Helper()
		var vols []*Volume
		for i := 0; i < k; i++ {
			vols = append(vols, testVolume(n))
			n++
		}
		putT(t, s, vols...)
	}
	// Many small records, then enough keys for a checkpoint (2 keys each).
	for i := 0; i < 40; i++ {
		batch(1)
	}
	batch(maxPending / 2)
	if pendingKeys(t, s) != 0 {
		t.Fatalf("no checkpoint after %d changed keys", 2*n)
	}
	copyPath := crashCopy(t, s) // the log holds 41 old records, all applied
	c := openT(t, copyPath)
	if got := len(allVolumes(t, c)); got != n {
		t.Fatalf("crash right after a checkpoint: %d volumes, want %d", got, n)
	}
	c.Close()
	// A few new records overwrite the start of the log; the old ones behind
	// them must not be taken for new ones.
	for i := 0; i < 3; i++ {
		batch(1)
	}
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(volID(0)) }); err != nil {
		t.Fatal(err)
	}
	c = openT(t, crashCopy(t, s))
	defer c.Close()
	if got := len(allVolumes(t, c)); got != n-1 {
		t.Fatalf("crash after new records: %d volumes, want %d", got, n-1)
	}
	if v := getVolume(t, c, volID(0)); v != nil {
		t.Fatal("the volume deleted after the checkpoint is back")
	}
}

func wantLogCorrupt(t *testing.T, dbPath string, why string) {
	t.Helper()
	before, _ := os.ReadFile(WALPath(dbPath))
	s, err := Open(dbPath)
	if err == nil {
		s.Close()
		t.Fatalf("Open with %s succeeded", why)
	}
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), WALPath(dbPath)) {
		t.Fatalf("Open with %s = %v, want ErrCorrupt naming the log", why, err)
	}
	if after, _ := os.ReadFile(WALPath(dbPath)); !bytes.Equal(before, after) {
		t.Fatalf("Open with %s changed the log", why)
	}
}

// TestWALForeign: a log written for another state file is refused next to
// an existing state file, and discarded next to a new one (the state file it
// belonged to is gone).
func TestWALForeign(t *testing.T) {
	a := openT(t, filepath.Join(t.TempDir(), FileName))
	defer a.Close()
	putT(t, a, testVolume(1))
	b := openT(t, filepath.Join(t.TempDir(), FileName))
	putT(t, b, testVolume(2))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	aCopy := crashCopy(t, a)

	mixed := b.path
	wal, _ := os.ReadFile(WALPath(aCopy))
	if err := os.WriteFile(WALPath(mixed), wal, 0o600); err != nil {
		t.Fatal(err)
	}
	wantLogCorrupt(t, mixed, "another state file's log")

	if err := os.Remove(aCopy); err != nil {
		t.Fatal(err)
	}
	s := openT(t, aCopy) // a new state file next to an old log
	if got := allVolumes(t, s); len(got) != 0 {
		t.Fatalf("a new state file took %d volumes from an old log", len(got))
	}
	putT(t, s, testVolume(3))
	c := openT(t, crashCopy(t, s))
	defer c.Close()
	if got := allVolumes(t, c); len(got) != 1 || got[0].ID != volID(3) {
		t.Fatalf("after a crash: %v, want only volume 3", got)
	}
	s.Close()
}

// TestWALGap: a state file older than the log's records (restored from a
// backup while the log holds later changes) is refused, not half-replayed.
func TestWALGap(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	putT(t, s, testVolume(0))
	old, err := os.ReadFile(s.path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= maxPending/2+5; i++ { // a checkpoint, then new records
		putT(t, s, testVolume(i))
	}
	copyPath := crashCopy(t, s)
	if err := os.WriteFile(copyPath, old, 0o600); err != nil {
		t.Fatal(err)
	}
	wantLogCorrupt(t, copyPath, "a state file older than its log")
}

// TestWALCleanClose: after Close the log holds no record and the state file
// alone holds everything.
func TestWALCleanClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	putT(t, s, testVolume(1), testVolume(2))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(WALPath(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(scanRecords(wal)) != 0 {
		t.Fatal("the log holds records after a clean close")
	}
	if len(wal) < walPrealloc {
		t.Fatalf("log is %d bytes, want it preallocated to %d", len(wal), walPrealloc)
	}
	if n := boltVolumeCount(t, path); n != 2 {
		t.Fatalf("state file holds %d volumes, want 2", n)
	}
	if fi, _ := os.Stat(WALPath(path)); fi.Mode().Perm() != 0o600 {
		t.Fatalf("log mode %v, want 0600", fi.Mode().Perm())
	}
}

// TestWALReadYourWrites: inside one group, later fns see earlier fns'
// changes, and deleting then re-creating a key works over pending changes.
func TestWALReadYourWrites(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	putT(t, s, testVolume(1))
	if err := s.Update(func(tx *Tx) error {
		if err := tx.DeleteVolume(volID(1)); err != nil {
			return err
		}
		if v, _ := tx.Volume(volID(1)); v != nil {
			return errors.New("deleted volume still visible in its transaction")
		}
		v := testVolume(1)
		v.CapacityBytes = 7
		return tx.PutVolume(v)
	}); err != nil {
		t.Fatal(err)
	}
	if v := getVolume(t, s, volID(1)); v == nil || v.CapacityBytes != 7 {
		t.Fatalf("got %+v", v)
	}
	if err := s.View(func(tx *Tx) error { return tx.PutVolume(testVolume(9)) }); err == nil {
		t.Fatal("a write in View succeeded")
	}
}

// TestWALWrap: more records than the log holds; it is checkpointed and
// reused from its start, and a crash afterwards loses nothing.
func TestWALWrap(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	n := walPrealloc/walBlock + 100
	for i := 0; i < n; i++ {
		putT(t, s, testVolume(i))
		if i%2 == 1 {
			if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(volID(i)) }); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := openT(t, crashCopy(t, s))
	defer c.Close()
	got := allVolumes(t, c)
	if len(got) != (n+1)/2 {
		t.Fatalf("%d volumes after the crash, want %d", len(got), (n+1)/2)
	}
	for i, v := range got {
		if v.ID != volID(2*i) {
			t.Fatalf("volume %d is %s, want %s", i, v.ID, volID(2*i))
		}
	}
}

// TestWALShortFile: a log that is not (or no longer) preallocated still
// works; records extend it.
func TestWALShortFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	putT(t, s, testVolume(1))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(WALPath(path), 0); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path)
	defer s.Close()
	s.wal.size = 0 // as if preallocating had failed (disk full)
	for i := 2; i < 5; i++ {
		putT(t, s, testVolume(i))
	}
	c := openT(t, crashCopy(t, s))
	defer c.Close()
	if got := allVolumes(t, c); len(got) != 4 {
		t.Fatalf("%d volumes after a crash, want 4", len(got))
	}
}
