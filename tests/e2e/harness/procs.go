package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A process the harness started is recorded in <work>/pids/<name>.pid as
// "<pid> <start time>": the start time (field 22 of /proc/<pid>/stat)
// makes sure a later stop never signals an unrelated process that got the
// same pid.

// startTime returns the start time of pid from /proc, or "" when there is
// no such process (or it is a zombie).
func startTime(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), so field 22 is f[19].
	if len(f) < 20 || f[0] == "Z" {
		return ""
	}
	return f[19]
}

// start runs a daemon in its own session with its output in
// <work>/logs/<name>.log. With a node it runs inside the node's mount
// and PID namespaces (nsenter, which forks: the pid recorded is its
// child's, the daemon itself, so a stop signals the daemon).
func (c *Cluster) start(name string, node *Node, env []string, argv ...string) (int, error) {
	if node != nil {
		pre, err := node.enter()
		if err != nil {
			return 0, err
		}
		argv = append(pre, argv...)
	}
	logf, err := os.OpenFile(filepath.Join(c.Work, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(append(os.Environ(), "TMPDIR="+filepath.Join(c.Work, "tmp")), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.Work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s: %w", name, err)
	}
	pid := cmd.Process.Pid
	go cmd.Wait() // reap it if it exits while this process lives
	if node != nil {
		for i := 0; i < 1000; i++ {
			if child := childOf(cmd.Process.Pid); child != 0 {
				pid = child
				break
			}
			if startTime(cmd.Process.Pid) == "" {
				break // nsenter failed or the command exited at once
			}
			time.Sleep(time.Millisecond)
		}
	}
	st := ""
	for i := 0; i < 100 && st == ""; i++ {
		if st = startTime(pid); st == "" {
			time.Sleep(time.Millisecond)
		}
	}
	if err := os.WriteFile(c.pidFile(name), []byte(fmt.Sprintf("%d %s\n", pid, st)), 0o644); err != nil {
		return 0, err
	}
	return pid, nil
}

func (c *Cluster) pidFile(name string) string { return filepath.Join(c.Work, "pids", name+".pid") }

// pidOf returns the pid recorded for name if that process still runs.
func (c *Cluster) pidOf(name string) int {
	b, err := os.ReadFile(c.pidFile(name))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	pid, _ := strconv.Atoi(f[0])
	if pid <= 0 || startTime(pid) != f[1] {
		return 0
	}
	return pid
}

// Running tells whether the process the harness started as name still runs.
func (c *Cluster) Running(name string) bool { return c.pidOf(name) != 0 }

// stop sends SIGTERM to the process recorded as name, then SIGKILL after
// grace, and waits until it is gone.
func (c *Cluster) stop(name string, grace time.Duration) error {
	pid := c.pidOf(name)
	if pid == 0 {
		os.Remove(c.pidFile(name))
		return nil
	}
	st := startTime(pid)
	err := signalAndWait(pid, st, grace)
	if err == nil {
		os.Remove(c.pidFile(name))
	}
	return err
}

// signalAndWait stops one process whose start time is st.
func signalAndWait(pid int, st string, grace time.Duration) error {
	sig := syscall.SIGTERM
	if grace <= 0 {
		sig = syscall.SIGKILL
	}
	_ = syscall.Kill(pid, sig)
	deadline := time.Now().Add(grace)
	if sig == syscall.SIGKILL {
		deadline = time.Now().Add(10 * time.Second)
	}
	for startTime(pid) == st && st != "" {
		if sig == syscall.SIGTERM && time.Now().After(deadline) {
			sig = syscall.SIGKILL
			_ = syscall.Kill(pid, sig)
			deadline = time.Now().Add(10 * time.Second)
		} else if sig == syscall.SIGKILL && time.Now().After(deadline) {
			return fmt.Errorf("pid %d survives SIGKILL", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// procsIn lists the processes whose mount namespace is ns (an
// "mnt:[inode]" link value) or whose cgroup path has cgroupMark.
func procsIn(ns, cgroupMark string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || startTime(pid) == "" { // gone, or a zombie waiting to be reaped
			continue
		}
		if ns != "" {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && l == ns {
				out = append(out, pid)
				continue
			}
		}
		if cgroupMark != "" {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil && strings.Contains(string(b), cgroupMark) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killAll SIGKILLs the given processes and waits for them to go.
func killAll(pids []int) error {
	var errs []error
	for _, pid := range pids {
		if st := startTime(pid); st != "" {
			errs = append(errs, signalAndWait(pid, st, 0))
		}
	}
	return errors.Join(errs...)
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// filterCgroup keeps the processes whose cgroup path has mark.
func filterCgroup(pids []int, mark string) []int {
	var out []int
	for _, pid := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid)); err == nil && strings.Contains(string(b), mark) {
			out = append(out, pid)
		}
	}
	return out
}
