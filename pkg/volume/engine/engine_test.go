package engine

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/tests/testfs"
)

func TestBtrfsEngineEnforcesAndSnapshots(t *testing.T) {
	mnt := testfs.New(t, testfs.Btrfs, 512<<20)
	e, err := New(Auto, mnt)
	if err != nil {
		t.Fatal(err)
	}
	if e.Name() != Btrfs {
		t.Fatalf("auto on btrfs chose %s", e.Name())
	}
	vol := filepath.Join(mnt, "v1")
	if err := e.Create(vol, 8<<20, 0o777); err != nil {
		t.Fatal(err)
	}
	if !isSubvolume(vol) {
		t.Fatal("volume is not a subvolume")
	}
	data := bytes.Repeat([]byte("x"), 6<<20)
	if err := os.WriteFile(filepath.Join(vol, "a"), data, 0o644); err != nil {
		t.Fatalf("write within limit: %v", err)
	}
	unix.Sync()
	err = os.WriteFile(filepath.Join(vol, "b"), data, 0o644)
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("write past the 8 MiB limit: err = %v, want EDQUOT", err)
	}
	os.Remove(filepath.Join(vol, "b"))
	unix.Sync()
	used, _, err := e.Usage(vol)
	if err != nil {
		t.Fatal(err)
	}
	if used < 6<<20 || used > 8<<20 {
		t.Fatalf("usage %d, want about 6 MiB", used)
	}
	snap := filepath.Join(mnt, "s1")
	if err := e.Snapshot(vol, snap); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(snap, "c"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
		t.Fatalf("snapshot writable: %v", err)
	}
	clone := filepath.Join(mnt, "c1")
	if err := e.Clone(snap, clone, 16<<20); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(clone, "a"))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("clone content differs: %v", err)
	}
	if err := os.WriteFile(filepath.Join(clone, "b"), data, 0o644); err != nil {
		t.Fatalf("clone at 16 MiB should take 12 MiB: %v", err)
	}
	for _, p := range []string{vol, snap, clone} {
		if err := Remove(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there", p)
		}
	}
}
