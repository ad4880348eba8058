// Package testcgroup makes pod cgroups the way the kubelet's cgroupfs
// driver lays them out (<cgroupRoot>/kubepods/besteffort/pod<uid>/<container>),
// in real cgroup hierarchies, and runs processes in them, for tests of
// per-pod I/O limits and freezes. It needs root and cgroup v1 blkio and
// freezer mounts (or a cgroup v2 root with the io and freezer features).
package testcgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Root is the cgroup root the tests use.
const Root = "/sys/fs/cgroup"

// Pod is a pod's cgroups: one container cgroup per controller (v1) or one
// in the unified hierarchy (v2).
type Pod struct {
	UID string
	// Containers are the container cgroups processes run in.
	Containers []string
}

// NewPod makes the cgroups of a pod with uid and one container, below a
// cgroupRoot of the test's own; they are removed (processes killed first)
// when the test ends.
func NewPod(t testing.TB, uid string) *Pod {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(Root, &st); err != nil {
		t.Fatalf("cgroup root: %v", err)
	}
	roots := []string{Root}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		roots = []string{filepath.Join(Root, "blkio"), filepath.Join(Root, "freezer")}
	}
	p := &Pod{UID: uid}
	top := fmt.Sprintf("localdir-test-%d-%s", os.Getpid(), uid)
	for _, r := range roots {
		c := filepath.Join(r, top, "kubepods", "besteffort", "pod"+uid, "ctr")
		if err := os.MkdirAll(c, 0o755); err != nil {
			t.Fatalf("make a pod cgroup: %v", err)
		}
		if len(roots) == 1 {
			// cgroup v2: the io controller must be enabled down to the
			// pod's cgroup (processes live in the leaf, ctr).
			d := r
			for _, part := range strings.Split(strings.TrimPrefix(filepath.Dir(c), r+"/"), "/") {
				_ = os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+io"), 0)
				d = filepath.Join(d, part)
			}
		}
		p.Containers = append(p.Containers, c)
		t.Cleanup(func() { remove(t, filepath.Join(r, top)) })
	}
	return p
}

// V2 tells whether the pod's cgroups are cgroup v2 ones.
func (p *Pod) V2() bool { return len(p.Containers) == 1 }

// Start starts the command in the pod's container cgroups (it is moved
// there before it execs name) and kills it when the test ends.
func (p *Pod) Start(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	gate := filepath.Join(t.TempDir(), "go")
	cmd := exec.Command("sh", append([]string{"-c", `while [ ! -e "$0" ]; do sleep 0.01; done; shift; exec "$@"`, gate, "--", name}, args...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for _, c := range p.Containers {
		if err := os.WriteFile(filepath.Join(c, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
			t.Fatalf("move %d into %s: %v", cmd.Process.Pid, c, err)
		}
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// Kill kills every process of the pod and waits until its cgroups are
// empty.
func (p *Pod) Kill(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		alive := 0
		for _, c := range p.Containers {
			b, _ := os.ReadFile(filepath.Join(c, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					alive++
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
		if alive == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: %d processes outlived SIGKILL", p.UID, alive)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// remove removes the cgroup tree at dir, deepest first, after killing
// what runs in it (and thawing it, or the kill never lands).
func remove(t testing.TB, dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for _, d := range dirs {
		_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		_ = os.WriteFile(filepath.Join(d, "cgroup.freeze"), []byte("0"), 0)
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		for try := 0; ; try++ {
			err := unix.Rmdir(dirs[i])
			if err == nil || os.IsNotExist(err) {
				break
			}
			if try == 100 {
				t.Errorf("remove cgroup %s: %v", dirs[i], err)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
