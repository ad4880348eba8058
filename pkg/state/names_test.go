package state

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// formatOf reads the format version, with the store closed.
func formatOf(t *testing.T, path string) string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version string
	_ = db.View(func(tx *bolt.Tx) error {
		version = string(tx.Bucket(bucketMeta).Get(keyVersion))
		return nil
	})
	return version
}

func wantNames(t *testing.T, s *Store, want map[string]string) {
	t.Helper()
	for name, id := range want {
		if got := nameOf(t, s, name); got != id {
			t.Errorf("VolumeIDByName(%q) = %q, want %q", name, got, id)
		}
	}
}

// The name index is rebuilt from the records at open and gives the same
// answers as before, including a name another volume took over.
func TestNameIndexAfterReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	v1, v2, v3, v4 := testVolume(1), testVolume(2), testVolume(3), testVolume(4)
	v3.Name = ""
	v4.Name = v2.Name // takes the name of v2 over
	eph := testVolume(5)
	eph.Name = "\x00ephemeral/inline-1"
	putT(t, s, v1, v2, v3)
	putT(t, s, v4, eph)
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v1.ID) }); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{v1.Name: "", v2.Name: v4.ID, "": "", eph.Name: eph.ID, "unknown": ""}
	wantNames(t, s, want)
	if got := getVolume(t, s, v2.ID); got == nil || got.Name != v2.Name {
		t.Fatalf("record of %s after its name was taken over: %+v", v2.ID, got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if version := formatOf(t, path); version != formatVersion {
		t.Fatalf("format %q, want %q", version, formatVersion)
	}
	s = openT(t, path)
	wantNames(t, s, want)
	// Deleting the volume whose name was taken over leaves the name alone;
	// deleting the holder frees it.
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v2.ID) }); err != nil {
		t.Fatal(err)
	}
	wantNames(t, s, map[string]string{v2.Name: v4.ID})
	if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v4.ID) }); err != nil {
		t.Fatal(err)
	}
	wantNames(t, s, map[string]string{v2.Name: ""})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, path)
	defer s.Close()
	wantNames(t, s, map[string]string{v2.Name: "", eph.Name: eph.ID})
}

// A file with two records holding one name is refused and left byte for
// byte.
func TestNamesThatDisagreeAreRefused(t *testing.T) {
	v1, v2 := testVolume(1), testVolume(2)
	cases := map[string]func(path string){
		"format 2, two records of one name": func(path string) {
			s := openT(t, path)
			putT(t, s, v1, v2)
			if err := s.db.Update(func(tx *bolt.Tx) error {
				v := *v2
				v.Name = v1.Name
				raw, _ := json.Marshal((*volumeJSON)(&v))
				return tx.Bucket(bucketVolumes).Put([]byte(v.ID), raw)
			}); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), FileName)
			mk(path)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(path)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want ErrCorrupt naming the file", err)
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, after) {
				t.Fatal("refused file was modified")
			}
		})
	}
}

// Within one group commit, an update sees the names of the updates before
// it; the names of a failed update, and of a group whose commit is retried
// without it, are not kept.
func TestNamesInGroupCommit(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	hold, held := make(chan struct{}), make(chan struct{})
	go func() {
		_ = s.Update(func(*Tx) error {
			select {
			case <-held:
			default:
				close(held)
			}
			<-hold
			return nil
		})
	}()
	<-held // the commit loop is busy: the updates below form one group
	v1, v2 := testVolume(1), testVolume(2)
	bad := testVolume(3)
	errBad := errors.New("refused")
	var wg sync.WaitGroup
	var seen, seenBad string
	results := make([]error, 3)
	updates := []func(*Tx) error{
		func(tx *Tx) error { return tx.PutVolume(v1) },
		func(tx *Tx) error {
			if err := tx.PutVolume(bad); err != nil {
				return err
			}
			return errBad
		},
		func(tx *Tx) error {
			seen, seenBad = tx.VolumeIDByName(v1.Name), tx.VolumeIDByName(bad.Name)
			return tx.PutVolume(v2)
		},
	}
	for i, fn := range updates {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = s.Update(fn) }()
		for len(s.ops) < i+1 {
			runtime.Gosched() // until queued, so the group keeps this order
		}
	}
	close(hold)
	wg.Wait()
	if results[0] != nil || results[2] != nil || !errors.Is(results[1], errBad) {
		t.Fatalf("results %v", results)
	}
	if seen != v1.ID || seenBad != "" {
		t.Fatalf("in the group: name of v1 = %q, name of the failed update = %q", seen, seenBad)
	}
	wantNames(t, s, map[string]string{v1.Name: v1.ID, v2.Name: v2.ID, bad.Name: ""})
	if getVolume(t, s, bad.ID) != nil {
		t.Fatal("failed update kept")
	}
}

// A read transaction answers from the records it sees: a name created
// after it began is not found in it (its record is not there), and one
// deleted after it began is not found either (the index moved on).
func TestNamesInOlderReadTransaction(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	v1, v2 := testVolume(1), testVolume(2)
	putT(t, s, v1)
	err := s.View(func(tx *Tx) error {
		putT(t, s, v2)
		if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v1.ID) }); err != nil {
			return err
		}
		if id := tx.VolumeIDByName(v2.Name); id != "" {
			return fmt.Errorf("older read transaction finds %q, whose record it does not see", id)
		}
		if id := tx.VolumeIDByName(v1.Name); id != "" {
			return fmt.Errorf("older read transaction finds deleted %q", id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantNames(t, s, map[string]string{v1.Name: "", v2.Name: v2.ID})
}

// TestCommitPages counts the pages a create and a delete commit write with
// 2,000 volumes of random CSI names: the volume records' B+tree path (three
// levels there) and the root bucket's page. Format 1 wrote the names
// bucket's path too: six pages per commit.
func TestCommitPages(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	defer s.Close()
	for i := 0; i < 2000; i += 200 {
		if err := s.Update(func(tx *Tx) error {
			for j := i; j < i+200; j++ {
				v := testVolume(j)
				v.Name = "pvc-" + randomHex(t, 16)
				if err := tx.PutVolume(v); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	writes := func() int64 { st := s.db.Stats(); return st.TxStats.GetWrite() }
	const pairs = 50
	w0 := writes()
	for i := 0; i < pairs; i++ {
		v := testVolume(100000 + i)
		v.Name = "pvc-" + randomHex(t, 16)
		putT(t, s, v)
		if err := s.Update(func(tx *Tx) error { return tx.DeleteVolume(v.ID) }); err != nil {
			t.Fatal(err)
		}
	}
	perCommit := float64(writes()-w0) / (2 * pairs)
	t.Logf("2,000 volumes: %.2f page writes per commit (meta page included)", perCommit)
	// 3 levels of volume records + the root bucket + the meta page: 5
	// (format 1: 7). The margin is for a leaf split now and then.
	if perCommit > 5.5 {
		t.Fatalf("%.2f page writes per commit with 2,000 volumes, want 5", perCommit)
	}
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", b)
}
