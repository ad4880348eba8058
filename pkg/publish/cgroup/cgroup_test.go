package cgroup_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/publish/cgroup"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
	"github.com/localdir-csi/localdir/tests/testcgroup"
)

// loopDevice attaches a 64 MiB image and returns its device and number.
func loopDevice(t *testing.T) (string, uint64) {
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev, err := loop.Attach(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = loop.Detach(img) })
	rdev, err := blockdev.Rdev(dev)
	if err != nil {
		t.Fatal(err)
	}
	return dev, rdev
}

// TestSetIOThrottlesThePod sets a write limit of 1 MiB/s for a pod and
// checks the kernel's rule on the pod's container cgroup (v1; the pod's
// on v2), a
// direct write of 2 MiB by the container taking about 2 s, and the rule
// gone after a zero Limits.
func TestSetIOThrottlesThePod(t *testing.T) {
	dev, rdev := loopDevice(t)
	pod := testcgroup.NewPod(t, "0b5e9c1e-0000-4000-8000-000000000001")
	h, err := cgroup.Open(testcgroup.Root)
	if err != nil {
		t.Fatal(err)
	}
	dirs, err := h.SetIO(pod.UID, []uint64{rdev}, cgroup.Limits{WriteBPS: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	num := strconv.Itoa(int(unix.Major(rdev))) + ":" + strconv.Itoa(int(unix.Minor(rdev)))
	file, want := "blkio.throttle.write_bps_device", num+" 1048576"
	if h.V2() {
		file, want = "io.max", num+" rbps=max wbps=1048576 riops=max wiops=max"
	} else if len(dirs) != 1 || dirs[0] != pod.Containers[0] {
		t.Fatalf("SetIO wrote %v, want the pod's container cgroup only", dirs)
	}
	for _, d := range dirs {
		if got := read(t, filepath.Join(d, file)); got != want {
			t.Errorf("%s/%s = %q, want %q", d, file, got, want)
		}
	}
	start := time.Now()
	cmd := pod.Start(t, "dd", "if=/dev/zero", "of="+dev, "bs=64k", "count=32", "oflag=direct")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dd: %v", err)
	}
	// 2 MiB at 1 MiB/s: the throttle lets a first slice through, so about
	// 1–2 s; unthrottled it takes milliseconds.
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("2 MiB of direct writes took %s under a 1 MiB/s limit", took)
	}
	if _, err := h.SetIO(pod.UID, []uint64{rdev}, cgroup.Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if got := read(t, filepath.Join(d, file)); strings.Contains(got, "1048576") {
			t.Errorf("after removing the limit %s/%s = %q", d, file, got)
		}
	}
	if _, err := h.SetIO("0b5e9c1e-0000-4000-8000-00000000dead", []uint64{rdev}, cgroup.Limits{WriteBPS: 1}); err == nil {
		t.Error("SetIO for a pod with no cgroup succeeded")
	}
}

// TestFreezeStopsThePod freezes a pod whose container counts into a file
// and checks that the count stands still until the thaw.
func TestFreezeStopsThePod(t *testing.T) {
	pod := testcgroup.NewPod(t, "0b5e9c1e-0000-4000-8000-000000000002")
	h, err := cgroup.Open(testcgroup.Root)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "n")
	pod.Start(t, "sh", "-c", `i=0; while true; do i=$((i+1)); echo $i > "$0.tmp"; mv "$0.tmp" "$0"; done`, out)
	count := func() int {
		n, _ := strconv.Atoi(strings.TrimSpace(read(t, out)))
		return n
	}
	waitFor(t, func() bool { return count() > 10 })
	dir, err := h.Freeze(pod.UID)
	if err != nil {
		t.Fatal(err)
	}
	if !h.IsPodDir(dir) {
		t.Errorf("IsPodDir(%q) = false", dir)
	}
	n := count()
	time.Sleep(200 * time.Millisecond)
	if m := count(); m != n {
		t.Errorf("a frozen pod counted from %d to %d", n, m)
	}
	if err := h.Thaw(dir); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return count() > n })
	if h.IsPodDir("/etc") || h.IsPodDir(dir+"/../..") {
		t.Error("IsPodDir takes a path that is not a pod's cgroup")
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func read(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
