package state

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func openT(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

func volID(i int) string { return fmt.Sprintf("vol-%032x", i) }

func testVolume(i int) *contract.Volume {
	return &contract.Volume{
		ID:            volID(i),
		Name:          fmt.Sprintf("pvc-%d", i),
		CapacityBytes: int64(i+1) << 20,
		AccessType:    contract.AccessMount,
		Parameters:    map[string]string{"dirMode": "0770"},
		Engine:        "dir",
		CreatedAt:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	}
}

func getVolume(t *testing.T, s *Store, id string) *contract.Volume {
	t.Helper()
	var v *contract.Volume
	if err := s.View(func(tx *Tx) error {
		var err error
		v, err = tx.Volume(id)
		return err
	}); err != nil {
		t.Fatalf("Volume(%s): %v", id, err)
	}
	return v
}

func nameOf(t *testing.T, s *Store, name string) string {
	t.Helper()
	var id string
	_ = s.View(func(tx *Tx) error { id = tx.VolumeIDByName(name); return nil })
	return id
}

func putT(t *testing.T, s *Store, vols ...*contract.Volume) {
	t.Helper()
	if err := s.Update(func(tx *Tx) error {
		for _, v := range vols {
			if err := tx.PutVolume(v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("PutVolume: %v", err)
	}
}

func TestOpenFresh(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	if v := getVolume(t, s, volID(1)); v != nil {
		t.Errorf("fresh store holds %+v", v)
	}
	n := 0
	if err := s.View(func(tx *Tx) error {
		return tx.ForEachVolume("", func(*contract.Volume) bool { n++; return true })
	}); err != nil || n != 0 {
		t.Fatalf("fresh store: %d volumes, %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopening a fresh, empty store works.
	s = openT(t, path)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The parent must exist; Open does not create directories.
	if _, err := Open(filepath.Join(t.TempDir(), "missing", FileName)); err == nil {
		t.Fatal("Open in a missing directory succeeded")
	}
}

func TestVolumes(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()

	v1, v2 := testVolume(1), testVolume(2)
	v2.Parameters = nil
	v2.SourceVolumeID = v1.ID
	putT(t, s, v1, v2)

	for _, want := range []*contract.Volume{v1, v2} {
		got := getVolume(t, s, want.ID)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("Volume(%s) = %+v, want %+v", want.ID, got, want)
		}
		if id := nameOf(t, s, want.Name); id != want.ID {
			t.Fatalf("VolumeIDByName(%q) = %q, want %q", want.Name, id, want.ID)
		}
	}
	if id := nameOf(t, s, "unknown"); id != "" {
		t.Fatalf("VolumeIDByName(unknown) = %q", id)
	}

	// A volume without a name gets no name mapping.
	anon := testVolume(3)
	anon.Name = ""
	putT(t, s, anon)
	if id := nameOf(t, s, ""); id != "" {
		t.Fatalf(`VolumeIDByName("") = %q`, id)
	}

	// Overwrite keeps one record.
	v1b := *v1
	v1b.CapacityBytes *= 2
	putT(t, s, &v1b)
	if got := getVolume(t, s, v1.ID); got.CapacityBytes != v1b.CapacityBytes {
		t.Fatalf("overwrite: capacity %d", got.CapacityBytes)
	}

	// Delete removes the record and its name.
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v1.ID) }); err != nil {
		t.Fatal(err)
	}
	if got := getVolume(t, s, v1.ID); got != nil {
		t.Fatalf("deleted volume still there: %+v", got)
	}
	if id := nameOf(t, s, v1.Name); id != "" {
		t.Fatalf("name of deleted volume still maps to %q", id)
	}
	// Deleting again, or an unknown id, is fine.
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v1.ID) }); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume("vol-unknown") }); err != nil {
		t.Fatalf("delete unknown: %v", err)
	}

	// A name that now maps to another volume keeps that mapping.
	v4 := testVolume(4)
	v5 := testVolume(5)
	v5.Name = v4.Name
	putT(t, s, v4, v5)
	if id := nameOf(t, s, v4.Name); id != v5.ID {
		t.Fatalf("name maps to %q, want %q", id, v5.ID)
	}
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v4.ID) }); err != nil {
		t.Fatal(err)
	}
	if id := nameOf(t, s, v4.Name); id != v5.ID {
		t.Fatalf("deleting %s removed the name of %s (now %q)", v4.ID, v5.ID, id)
	}
	if getVolume(t, s, v2.ID) == nil || getVolume(t, s, anon.ID) == nil {
		t.Fatal("unrelated volumes vanished")
	}
}

func TestSnapshots(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	snap := &contract.Snapshot{ID: "snap-" + strings.Repeat("a", 32), Name: "snapshot-1", SourceVolumeID: volID(1),
		SizeBytes: 1 << 20, AccessType: contract.AccessMount, CreatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if err := s.Update(func(tx *Tx) error { return tx.PutSnapshot(snap) }); err != nil {
		t.Fatal(err)
	}
	var got *contract.Snapshot
	var byName string
	var all []string
	_ = s.View(func(tx *Tx) error {
		got, _ = tx.Snapshot(snap.ID)
		byName = tx.SnapshotIDByName(snap.Name)
		return tx.ForEachSnapshot("", func(x *contract.Snapshot) bool { all = append(all, x.ID); return true })
	})
	if !reflect.DeepEqual(got, snap) || byName != snap.ID || len(all) != 1 {
		t.Fatalf("snapshot = %+v, byName %q, all %v", got, byName, all)
	}
	// Volumes and snapshots do not share a namespace.
	if getVolume(t, s, snap.ID) != nil {
		t.Fatal("snapshot visible as a volume")
	}
	if err := s.Update(func(tx *Tx) error { return tx.DeleteSnapshot(snap.ID) }); err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		got, _ = tx.Snapshot(snap.ID)
		byName = tx.SnapshotIDByName(snap.Name)
		return nil
	})
	if got != nil || byName != "" {
		t.Fatalf("after delete: %+v, %q", got, byName)
	}
}

func listIDs(t *testing.T, s *Store, after string, limit int) []string {
	t.Helper()
	var ids []string
	if err := s.View(func(tx *Tx) error {
		return tx.ForEachVolume(after, func(v *contract.Volume) bool {
			ids = append(ids, v.ID)
			return limit <= 0 || len(ids) < limit
		})
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestForEachVolumePagination(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	const n = 25
	var want []string
	// Insert out of order; iteration is in id order.
	for _, i := range []int{7, 3, 24, 0, 11, 19, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23} {
		putT(t, s, testVolume(i*2)) // even numbers only, so odd ones fall between
	}
	for i := 0; i < n; i++ {
		want = append(want, volID(i*2))
	}
	if got := listIDs(t, s, "", 0); !reflect.DeepEqual(got, want) {
		t.Fatalf("all = %v\nwant %v", got, want)
	}

	// Pages of 10, continuing after the last id of each page.
	var paged []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > n {
			t.Fatal("pagination does not end")
		}
		page := listIDs(t, s, after, 10)
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1]
	}
	if !reflect.DeepEqual(paged, want) {
		t.Fatalf("paged = %v\nwant %v", paged, want)
	}

	tests := []struct {
		name  string
		after string
		want  []string
	}{
		{"after first", volID(0), want[1:]},
		{"after an id that is not stored", volID(5), want[3:]},
		{"after the last", volID(48), nil},
		{"after everything", "vol-~", nil},
		{"before everything", "a", want},
		{"prefix only", "vol-", want},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := listIDs(t, s, tc.after, 0); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("after %q = %v, want %v", tc.after, got, tc.want)
			}
		})
	}
	// fn returning false stops at once.
	if got := listIDs(t, s, "", 1); len(got) != 1 || got[0] != want[0] {
		t.Fatalf("limit 1 = %v", got)
	}
}

func TestUpdateError(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	boom := errors.New("boom")
	err := s.Update(func(tx *Tx) error {
		if err := tx.PutVolume(testVolume(1)); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update = %v, want boom", err)
	}
	if getVolume(t, s, volID(1)) != nil || nameOf(t, s, testVolume(1).Name) != "" {
		t.Fatal("a failed Update left its writes behind")
	}
}

// TestGroupCommit queues 32 updates behind a commit in flight so that they
// share commits; every fourth fails. Each caller gets its own result, the
// failing ones leave nothing behind and all others land.
func TestGroupCommit(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()

	// Hold the committer inside a transaction.
	entered, unblock := make(chan struct{}), make(chan struct{})
	blockerDone := make(chan error, 1)
	go func() {
		blockerDone <- s.Update(func(tx *Tx) error {
			select {
			case <-entered:
			default:
				close(entered)
			}
			<-unblock
			return tx.PutVolume(testVolume(1000))
		})
	}()
	<-entered

	const n = 32
	var wg sync.WaitGroup
	errs := make([]error, n)
	var mu sync.Mutex
	runs := map[int]int{}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = s.Update(func(tx *Tx) error {
				mu.Lock()
				runs[i]++
				mu.Unlock()
				if err := tx.PutVolume(testVolume(i)); err != nil {
					return err
				}
				if i%4 == 3 {
					return fmt.Errorf("update %d fails", i)
				}
				return nil
			})
		}(i)
	}
	// Wait until all 32 are queued, then let the committer go.
	deadline := time.Now().Add(10 * time.Second)
	for len(s.ops) < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d updates queued", len(s.ops))
		}
		time.Sleep(time.Millisecond)
	}
	close(unblock)
	wg.Wait()
	if err := <-blockerDone; err != nil {
		t.Fatalf("blocking update: %v", err)
	}

	for i := 0; i < n; i++ {
		if i%4 == 3 {
			if errs[i] == nil || errs[i].Error() != fmt.Sprintf("update %d fails", i) {
				t.Errorf("update %d: error %v, want its own", i, errs[i])
			}
			if v := getVolume(t, s, volID(i)); v != nil {
				t.Errorf("failed update %d landed", i)
			}
			if runs[i] != 1 {
				t.Errorf("failing fn %d ran %d times, want once", i, runs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Errorf("update %d: %v", i, errs[i])
		}
		if v := getVolume(t, s, volID(i)); !reflect.DeepEqual(v, testVolume(i)) {
			t.Errorf("update %d: stored %+v", i, v)
		}
		if id := nameOf(t, s, testVolume(i).Name); id != volID(i) {
			t.Errorf("update %d: name maps to %q", i, id)
		}
	}
	// They were grouped: with 8 failures among 32 queued ops, the
	// successful ones were retried at least once.
	retried := 0
	for i := 0; i < n; i++ {
		if i%4 != 3 && runs[i] > 1 {
			retried++
		}
	}
	if retried == 0 {
		t.Error("no successful fn was re-run: updates were not grouped")
	}
	if got := len(listIDs(t, s, "", 0)); got != n-n/4+1 {
		t.Errorf("%d volumes stored, want %d", got, n-n/4+1)
	}
}

// TestConcurrentUpdates: plain concurrent updates from many goroutines all
// land (no artificial blocking).
func TestConcurrentUpdates(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	const n = 32
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := s.Update(func(tx *Tx) error { return tx.PutVolume(testVolume(i)) }); err != nil {
				t.Errorf("update %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	if got := len(listIDs(t, s, "", 0)); got != n {
		t.Fatalf("%d volumes, want %d", got, n)
	}
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	var want []*contract.Volume
	for i := 0; i < 50; i++ {
		want = append(want, testVolume(i))
	}
	putT(t, s, want...)
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(volID(7)) }); err != nil {
		t.Fatal(err)
	}
	want = append(want[:7], want[8:]...)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for round := 0; round < 2; round++ {
		s = openT(t, path)
		var got []*contract.Volume
		if err := s.View(func(tx *Tx) error {
			return tx.ForEachVolume("", func(v *contract.Volume) bool { got = append(got, v); return true })
		}); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: %d volumes after reopen, want %d", round, len(got), len(want))
		}
		for _, v := range want {
			if id := nameOf(t, s, v.Name); id != v.ID {
				t.Fatalf("name %q maps to %q after reopen", v.Name, id)
			}
		}
		if id := nameOf(t, s, "pvc-7"); id != "" {
			t.Fatalf("deleted name maps to %q after reopen", id)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// validStateFile returns the bytes of a state file holding n volumes.
func validStateFile(t *testing.T, n int) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	for i := 0; i < n; i++ {
		putT(t, s, testVolume(i)) // one commit each: many pages in use
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantCorrupt opens a file holding content and expects ErrCorrupt naming
// the path, with the file left byte for byte as it was.
func wantCorrupt(t *testing.T, content []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, content, 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	s, err := Open(path)
	if err == nil {
		s.Close()
		t.Fatalf("Open of a damaged file (%d bytes) succeeded", len(content))
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open = %v, want ErrCorrupt", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("error %q does not name %s", err, path)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after, content) {
		t.Fatalf("Open changed the damaged file (%d bytes before, %d after)", len(content), len(after))
	}
	if fi, _ := os.Stat(path); !fi.ModTime().Equal(before.ModTime()) || fi.Mode() != before.Mode() {
		t.Fatalf("Open touched the damaged file: %v %v → %v %v", before.ModTime(), before.Mode(), fi.ModTime(), fi.Mode())
	}
	// A second attempt fails the same way.
	if _, err := Open(path); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("second Open = %v", err)
	}
}

func TestOpenDamaged(t *testing.T) {
	valid := validStateFile(t, 300)
	garbage := func(n int) []byte {
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name    string
		content []byte
	}{
		{"empty", nil},
		{"truncated to 37 bytes", valid[:37]},
		{"truncated to 1 byte", valid[:1]},
		{"truncated to one page", valid[:4096]},
		{"random garbage 100 bytes", garbage(100)},
		{"random garbage 64 KiB", garbage(64 << 10)},
		{"random garbage 1 MiB", garbage(1 << 20)},
		{"zeros 64 KiB", make([]byte, 64<<10)},
		{"text", []byte("this is not a database\n")},
		// (One bad meta page alone is bbolt's torn-write case: it falls back
		// to the other one by design.)
		{"both meta pages garbage", append(garbage(8192), valid[8192:]...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantCorrupt(t, tc.content) })
	}
}

// TestOpenTruncated cuts a real state file short at page boundaries, as an
// interrupted copy or restore would. Where the cut removes pages its meta
// page still refers to, Open must fail with ErrCorrupt (not crash the
// process with SIGBUS on the missing pages); where it only removes unused
// preallocated space, the data must be intact.
func TestOpenTruncated(t *testing.T) {
	valid := validStateFile(t, 300)
	highWater := func() int64 {
		path := filepath.Join(t.TempDir(), "probe.db")
		if err := os.WriteFile(path, valid, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var n int64
		_ = db.View(func(tx *bolt.Tx) error { n = tx.Size(); return nil })
		return n
	}()
	if highWater <= 3*4096 || highWater > int64(len(valid)) {
		t.Fatalf("test setup: high-water mark %d, file %d bytes", highWater, len(valid))
	}
	cuts := []int64{8192, 8192 + 37, 12288, highWater / 2, highWater - 4096, highWater - 1}
	for _, cut := range cuts {
		t.Run(fmt.Sprintf("cut at %d", cut), func(t *testing.T) { wantCorrupt(t, valid[:cut]) })
	}
	// Cutting only unused space at the end loses nothing.
	path := filepath.Join(t.TempDir(), FileName)
	if err := os.WriteFile(path, valid[:highWater], 0o600); err != nil {
		t.Fatal(err)
	}
	s := openT(t, path)
	defer s.Close()
	if got := len(listIDs(t, s, "", 0)); got != 300 {
		t.Fatalf("%d volumes after cutting unused space, want 300", got)
	}
}

// TestOpenForeign: valid bbolt files that are not localdir state files (no
// meta bucket, another format version) are refused and not modified.
func TestOpenForeign(t *testing.T) {
	mk := func(fill func(tx *bolt.Tx) error) []byte {
		path := filepath.Join(t.TempDir(), "foreign.db")
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(fill); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Run("no meta bucket", func(t *testing.T) {
		wantCorrupt(t, mk(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket([]byte("other"))
			if err != nil {
				return err
			}
			return b.Put([]byte("k"), []byte("v"))
		}))
	})
	t.Run("newer format", func(t *testing.T) {
		wantCorrupt(t, mk(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return err
			}
			return b.Put(keyVersion, []byte("3"))
		}))
	})
	t.Run("no format version", func(t *testing.T) {
		wantCorrupt(t, mk(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucket(bucketMeta)
			return err
		}))
	})
}

// TestCorruptRecord: a record that is not JSON is reported as ErrCorrupt by
// reads, not skipped.
func TestCorruptRecord(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	putT(t, s, testVolume(1), testVolume(3))
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketVolumes).Put([]byte(volID(2)), []byte("{not json"))
	}); err != nil {
		t.Fatal(err)
	}
	err := s.View(func(tx *Tx) error {
		_, err := tx.Volume(volID(2))
		return err
	})
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), volID(2)) {
		t.Fatalf("Volume(corrupt) = %v", err)
	}
	var seen []string
	err = s.View(func(tx *Tx) error {
		return tx.ForEachVolume("", func(v *contract.Volume) bool { seen = append(seen, v.ID); return true })
	})
	if !errors.Is(err, ErrCorrupt) || len(seen) != 1 {
		t.Fatalf("ForEachVolume over a corrupt record = %v after %v", err, seen)
	}
	// Records around it are still readable one by one.
	if v := getVolume(t, s, volID(3)); v == nil {
		t.Fatal("neighbour record lost")
	}
}

func TestCloseWaitsForQueuedUpdates(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := s.Update(func(tx *Tx) error { return tx.PutVolume(testVolume(i)) }); err != nil {
				t.Errorf("update %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path)
	defer s.Close()
	got := map[string]bool{}
	for _, id := range listIDs(t, s, "", 0) {
		got[id] = true
	}
	want := map[string]bool{}
	for i := 0; i < 16; i++ {
		want[volID(i)] = true
	}
	if !maps.Equal(got, want) {
		t.Fatalf("after reopen: %v", got)
	}
}

// TestOpenLocked: a second Open of a file in use waits for the lock, then
// fails saying so (not ErrCorrupt), and leaves the first store working.
func TestOpenLocked(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5 s lock timeout")
	}
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	defer s.Close()
	putT(t, s, testVolume(1))
	_, err := Open(path)
	if err == nil || errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "locked") || !strings.Contains(err.Error(), path) {
		t.Fatalf("second Open = %v, want a lock error naming the file", err)
	}
	putT(t, s, testVolume(2))
	if getVolume(t, s, volID(2)) == nil {
		t.Fatal("first store broken by the second Open")
	}
}

// TestPublications stores publications of two volumes, one of whose id is
// a prefix of the other's, lists them per volume, reopens the file and
// deletes one.
func TestPublications(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	a, b := volID(1), volID(1)+"0"
	pubs := []*Publication{
		{VolumeID: a, TargetPath: "/pods/1/mount", StagingPath: "/staging/a", PodUID: "uid-1"},
		{VolumeID: a, TargetPath: "/pods/2/mount", PodUID: "uid-2"},
		{VolumeID: b, TargetPath: "/pods/3/mount", PodUID: "uid-3"},
	}
	if err := s.Update(func(tx *Tx) error {
		for _, p := range pubs {
			if err := tx.PutPublication(p); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path)
	defer s.Close()
	list := func(id string) []*Publication {
		var out []*Publication
		if err := s.View(func(tx *Tx) (err error) { out, err = tx.Publications(id); return err }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := list(a); !reflect.DeepEqual(got, pubs[:2]) {
		t.Errorf("publications of %s = %+v", a, got)
	}
	if got := list(""); len(got) != 3 {
		t.Errorf("all publications = %+v", got)
	}
	if err := s.Update(func(tx *Tx) error { return tx.DeletePublication(a, "/pods/1/mount") }); err != nil {
		t.Fatal(err)
	}
	var one *Publication
	_ = s.View(func(tx *Tx) (err error) { one, err = tx.Publication(a, "/pods/2/mount"); return err })
	if got := list(a); len(got) != 1 || !reflect.DeepEqual(one, pubs[1]) {
		t.Errorf("after a delete: %+v, %+v", got, one)
	}
}
