package engine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	checkLimit(t, e, vol, 8<<20)
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
	checkLimit(t, e, clone, 16<<20)
	if err := e.Resize(vol, 24<<20); err != nil {
		t.Fatal(err)
	}
	checkLimit(t, e, vol, 24<<20)
	// btrfs gives a snapshot's qgroup the limits of its source's.
	checkLimit(t, e, snap, 8<<20)
	// A subvolume nobody limited: 0.
	plain := filepath.Join(mnt, "plain")
	if out, err := exec.Command("btrfs", "subvolume", "create", plain).CombinedOutput(); err != nil {
		t.Fatalf("btrfs subvolume create: %v: %s", err, out)
	}
	checkLimit(t, e, plain, 0)
	for _, p := range []string{vol, snap, clone, plain} {
		if err := Remove(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s still there", p)
		}
	}
}

// checkLimit checks that Limit of the subvolume at p is want bytes, and
// that btrfs-progs reports the same max_rfer for its qgroup (0/<subvolume
// id>; "none" for no limit).
func checkLimit(t *testing.T, e Engine, p string, want int64) {
	t.Helper()
	got, err := e.Limit(p)
	if err != nil || got != want {
		t.Fatalf("Limit(%s) = %d, %v; want %d", p, got, err, want)
	}
	fd, err := openDir(p)
	if err != nil {
		t.Fatal(err)
	}
	id, err := subvolumeID(fd)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("btrfs", "qgroup", "show", "-r", "--raw", p).CombinedOutput()
	if err != nil {
		t.Fatalf("btrfs qgroup show: %v: %s", err, out)
	}
	cli := "none"
	if want > 0 {
		cli = strconv.FormatInt(want, 10)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[0] == fmt.Sprintf("0/%d", id) {
			if f[3] != cli {
				t.Fatalf("btrfs qgroup show says max_rfer %s for %s, want %s:\n%s", f[3], p, cli, out)
			}
			return
		}
	}
	t.Fatalf("btrfs qgroup show lists no qgroup 0/%d:\n%s", id, out)
}
