package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// testParts returns host parts with names of this test process's own
// (so a cluster running beside the test is never touched), a free port
// standing for the control plane's, and a function that makes the parts:
// two bridges, the nftables table and a cgroup tree. Cleanup removes them.
func testParts(t *testing.T) (h hostParts, port int, mk func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (bridges, nftables, cgroups)")
	}
	id := strconv.Itoa(os.Getpid() % 100000)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	h = hostParts{linkPrefix: "ldirt" + id, table: "localdir_t" + id, cgroupRoot: "localdir-t" + id, ports: []int{port}}
	t.Cleanup(func() {
		_ = run(context.Background(), "ip", "link", "delete", h.linkPrefix+"x")
		if err := h.remove(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	mk = func() {
		t.Helper()
		for _, c := range [][]string{
			{"ip", "link", "add", h.linkPrefix + "-n", "type", "bridge"},
			{"ip", "link", "add", h.linkPrefix + "0", "type", "bridge"},
			{"nft", "add", "table", "ip", h.table},
		} {
			if err := run(context.Background(), c...); err != nil {
				t.Fatal(err)
			}
		}
		if err := mkCgroupRoot(h.cgroupRoot + "/node"); err != nil {
			t.Fatal(err)
		}
		if got := len(h.left()); got != 4 {
			t.Fatalf("made %q, want two links, the table and the cgroups", h.left())
		}
	}
	return h, port, mk
}

// TestReclaimStaleHostParts: a run killed in another checkout leaves its
// bridges, nftables table and cgroups behind, and the next run (whose
// Down does not know that checkout's work folder) refused to start, as
// CI once did. Up now removes them when nothing of a cluster runs, and
// still refuses, removing nothing, while a control plane port is taken,
// a process runs in the cgroups or an interface is attached to a bridge.
// The parts get names of their own so that a cluster running beside the
// test is never touched.
func TestReclaimStaleHostParts(t *testing.T) {
	h, port, mk := testParts(t)
	ctx := context.Background()
	id := strconv.Itoa(os.Getpid() % 100000)
	refused := func(want string) {
		t.Helper()
		before := h.left()
		err := h.reclaim(t.Logf)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("reclaim = %v, want a refusal naming %q", err, want)
		}
		if after := h.left(); strings.Join(after, "|") != strings.Join(before, "|") {
			t.Fatalf("a refused reclaim changed the host: %q, then %q", before, after)
		}
	}
	reclaimed := func() {
		t.Helper()
		if err := h.reclaim(t.Logf); err != nil {
			t.Fatal(err)
		}
		if left := h.left(); len(left) > 0 {
			t.Fatalf("left after reclaim: %q", left)
		}
	}

	mk()
	reclaimed()

	mk()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	refused(fmt.Sprintf("port 127.0.0.1:%d is taken", port))
	l.Close()

	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	procs := filepath.Join("/sys/fs/cgroup/pids", h.cgroupRoot, "node", "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	refused(fmt.Sprintf("processes [%d] run in its cgroups", sleep.Process.Pid))
	_ = sleep.Process.Kill()
	_ = sleep.Wait()

	if err := run(ctx, "ip", "link", "add", h.linkPrefix+"x", "type", "veth", "peer", "name", "ldtp"+id); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, "ip", "link", "set", h.linkPrefix+"x", "master", h.linkPrefix+"0"); err != nil {
		t.Fatal(err)
	}
	refused("bridge " + h.linkPrefix + "0 has 1 interface(s)")
	if err := run(ctx, "ip", "link", "delete", h.linkPrefix+"x"); err != nil {
		t.Fatal(err)
	}
	reclaimed()
}

// TestDownLeavesAnotherCheckoutsCluster: Down in a checkout whose own
// cluster no longer runs (its work folder only names dead processes)
// must not stop the cluster another checkout runs, whose cgroups, bridges
// and table have the same names: it fails, saying so, and leaves them.
// Before, it killed that cluster's pods and deleted its network.
func TestDownLeavesAnotherCheckoutsCluster(t *testing.T) {
	h, port, mk := testParts(t)
	mk()
	c := New(Options{Root: t.TempDir(), Work: t.TempDir(), Logf: t.Logf})
	c.host = h
	if err := os.MkdirAll(filepath.Join(c.Work, "pids"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A pid that no process has (pid_max is at most 2^22).
	if err := os.WriteFile(c.pidFile("kube-apiserver"), []byte("5000000 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	before := h.left()
	err = c.Down(context.Background(), false)
	if err == nil || !strings.Contains(err.Error(), "another cluster does") || !strings.Contains(err.Error(), "is taken") {
		t.Fatalf("Down = %v, want a refusal naming the taken port", err)
	}
	if after := h.left(); strings.Join(after, "|") != strings.Join(before, "|") {
		t.Fatalf("Down changed another cluster's host parts: %q, then %q", before, after)
	}
}
