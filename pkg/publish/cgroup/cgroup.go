// Package cgroup finds a Kubernetes pod's cgroups on this node (by walking
// the hierarchy for "pod<uid>" or systemd's "...-pod<uid>.slice", so any
// kubelet cgroupRoot works) and sets their block I/O limits (v1
// blkio.throttle.*, v2 io.max) and freezer (v1 freezer.state, v2 cgroup.freeze).
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoPod is returned when no cgroup of the pod exists on this node (it
// is gone, or the kubelet runs in another cgroup hierarchy).
var ErrNoPod = errors.New("no cgroup of the pod")

// Limits are block I/O limits on one device; 0 is "no limit".
type Limits struct {
	// ReadBPS and WriteBPS in bytes per second.
	ReadBPS, WriteBPS uint64
	// ReadIOPS and WriteIOPS in I/O operations per second.
	ReadIOPS, WriteIOPS uint64
}

// None tells whether l limits nothing.
func (l Limits) None() bool { return l == Limits{} }

// Hierarchy is the cgroup hierarchy mounted at a root: v2 when it is a
// cgroup2 mount, else v1 with one mount per controller below it.
type Hierarchy struct {
	root string
	v2   bool

	mu    sync.Mutex
	found map[string]string // controller/uid → pod cgroup directory
}

// Open reads the hierarchy at root (normally /sys/fs/cgroup). Errors: the
// root cannot be read.
func Open(root string) (*Hierarchy, error) {
	root = filepath.Clean(root)
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("cgroup root %s: %w", root, err)
	}
	return &Hierarchy{root: root, v2: st.Type == unix.CGROUP2_SUPER_MAGIC, found: map[string]string{}}, nil
}

// V2 tells whether the hierarchy is cgroup v2.
func (h *Hierarchy) V2() bool { return h.v2 }

// controllerRoot is where the controller's hierarchy is mounted.
func (h *Hierarchy) controllerRoot(controller string) string {
	if h.v2 {
		return h.root
	}
	return filepath.Join(h.root, controller)
}

// maxDepth bounds the walk for a pod's cgroup: the kubelet's cgroupRoot
// plus kubepods/<class>/pod<uid>.
const maxDepth = 8

// PodDir is pod uid's cgroup directory in controller's hierarchy ("blkio" or
// "freezer"). Errors: ErrNoPod.
func (h *Hierarchy) PodDir(controller, uid string) (string, error) {
	if uid == "" || strings.ContainsAny(uid, "/\x00") {
		return "", fmt.Errorf("%w: pod uid %q", ErrNoPod, uid)
	}
	key := controller + "/" + uid
	h.mu.Lock()
	dir, ok := h.found[key]
	h.mu.Unlock()
	if ok {
		if _, err := os.Stat(dir); err == nil {
			return dir, nil
		}
	}
	systemd := "-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
	match := func(name string) bool { return name == "pod"+uid || strings.HasSuffix(name, systemd) }
	dir = find(h.controllerRoot(controller), match, maxDepth)
	h.mu.Lock()
	defer h.mu.Unlock()
	if dir == "" {
		delete(h.found, key)
		return "", fmt.Errorf("%w %s under %s", ErrNoPod, uid, h.controllerRoot(controller))
	}
	h.found[key] = dir
	return dir, nil
}

// find is the first directory below dir (breadth first, down to depth)
// whose name matches; other pods' directories are not entered.
func find(dir string, match func(string) bool, depth int) string {
	level := []string{dir}
	for d := 0; d < depth && len(level) > 0; d++ {
		var next []string
		for _, p := range level {
			ents, err := os.ReadDir(p)
			if err != nil {
				continue
			}
			for _, e := range ents {
				if !e.IsDir() {
					continue
				}
				name := e.Name()
				if match(name) {
					return filepath.Join(p, name)
				}
				if !strings.HasPrefix(name, "pod") && !strings.Contains(name, "-pod") {
					next = append(next, filepath.Join(p, name))
				}
			}
		}
		level = next
	}
	return ""
}

// Subtree is dir and every cgroup below it, parents first.
func Subtree(dir string) []string {
	out := []string{dir}
	for i := 0; i < len(out); i++ {
		ents, err := os.ReadDir(out[i])
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.IsDir() {
				out = append(out, filepath.Join(out[i], e.Name()))
			}
		}
	}
	return out
}

// SetIO sets the I/O limits l on devs (unix.Mkdev numbers) for pod uid (zero
// Limits remove them) and returns the directories written. v2: the pod's
// io.max, covering its containers. v1 throttling does not descend, so the
// rules go into every cgroup below the pod's (later containers: WatchDir),
// not the pod's own: on kernel 6.18 a rule there, written before the
// containers' cgroups existed, kept their rules from throttling anything.
func (h *Hierarchy) SetIO(uid string, devs []uint64, l Limits) ([]string, error) {
	dir, err := h.PodDir("blkio", uid)
	if err != nil {
		return nil, err
	}
	if h.v2 {
		for _, dev := range devs {
			line := fmt.Sprintf("%s rbps=%s wbps=%s riops=%s wiops=%s", devNum(dev),
				maxOr(l.ReadBPS), maxOr(l.WriteBPS), maxOr(l.ReadIOPS), maxOr(l.WriteIOPS))
			if err := write(filepath.Join(dir, "io.max"), line); err != nil {
				return nil, err
			}
		}
		return []string{dir}, nil
	}
	dirs := Subtree(dir)[1:] // the containers' cgroups: not the pod's own
	for _, d := range dirs {
		for _, dev := range devs {
			for file, v := range map[string]uint64{
				"blkio.throttle.read_bps_device":   l.ReadBPS,
				"blkio.throttle.write_bps_device":  l.WriteBPS,
				"blkio.throttle.read_iops_device":  l.ReadIOPS,
				"blkio.throttle.write_iops_device": l.WriteIOPS,
			} {
				// "<maj:min> 0" removes the device's rule.
				if err := write(filepath.Join(d, file), devNum(dev)+" "+strconv.FormatUint(v, 10)); err != nil {
					if errors.Is(err, os.ErrNotExist) {
						break // the container's cgroup went away
					}
					return nil, err
				}
			}
		}
	}
	return dirs, nil
}

// WatchDir is the directory whose new subdirectories (containers) need SetIO
// again: the pod's blkio cgroup on v1, "" on v2. Errors: ErrNoPod.
func (h *Hierarchy) WatchDir(uid string) (string, error) {
	if h.v2 {
		return "", nil
	}
	return h.PodDir("blkio", uid)
}

// freezeWait bounds how long Freeze waits for every task to stop.
var freezeWait = 5 * time.Second

// Freeze freezes pod uid and waits until the kernel reports it frozen,
// returning the directory for Thaw; not frozen within freezeWait (a task in
// uninterruptible sleep) it is undone and fails. Errors: ErrNoPod, the kernel's.
func (h *Hierarchy) Freeze(uid string) (string, error) {
	dir, err := h.PodDir("freezer", uid)
	if err != nil {
		return "", err
	}
	if err := h.setFrozen(dir, true); err != nil {
		return "", err
	}
	deadline := time.Now().Add(freezeWait)
	for {
		frozen, err := h.frozen(dir)
		if err == nil && frozen {
			return dir, nil
		}
		if err != nil || time.Now().After(deadline) {
			if terr := h.Thaw(dir); terr != nil {
				err = errors.Join(err, terr)
			}
			if err == nil {
				err = fmt.Errorf("pod %s did not freeze within %s", uid, freezeWait)
			}
			return "", err
		}
		time.Sleep(time.Millisecond)
		// Ask again: a task that entered a freezable wait after the first request
		// (a shell's vfork parent, seen on v1) is frozen only by a new one.
		if err := h.setFrozen(dir, true); err != nil {
			_ = h.Thaw(dir)
			return "", err
		}
	}
}

// Thaw lets the processes of the cgroup dir (from Freeze) run again. A
// cgroup that is gone has nothing to thaw.
func (h *Hierarchy) Thaw(dir string) error {
	err := h.setFrozen(dir, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// IsPodDir tells whether dir, read back from a record, can be a pod's
// freezer cgroup of this hierarchy.
func (h *Hierarchy) IsPodDir(dir string) bool {
	name := filepath.Base(dir)
	return filepath.Clean(dir) == dir && strings.HasPrefix(dir, h.controllerRoot("freezer")+"/") &&
		(strings.HasPrefix(name, "pod") || strings.Contains(name, "-pod"))
}

func (h *Hierarchy) setFrozen(dir string, on bool) error {
	if h.v2 {
		return write(filepath.Join(dir, "cgroup.freeze"), map[bool]string{true: "1", false: "0"}[on])
	}
	return write(filepath.Join(dir, "freezer.state"), map[bool]string{true: "FROZEN", false: "THAWED"}[on])
}

func (h *Hierarchy) frozen(dir string) (bool, error) {
	if h.v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
		return strings.Contains(string(b), "frozen 1"), err
	}
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	return strings.TrimSpace(string(b)) == "FROZEN", err
}

func devNum(dev uint64) string { return fmt.Sprintf("%d:%d", unix.Major(dev), unix.Minor(dev)) }

func maxOr(v uint64) string {
	if v == 0 {
		return "max"
	}
	return strconv.FormatUint(v, 10)
}

// write writes s to the cgroup file p (which exists: cgroup files are
// never created).
func write(p, s string) error {
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		return fmt.Errorf("write %q to %s: %w", s, p, err)
	}
	return f.Close()
}
