package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// hostPaths are the host paths a kubelet, containerd or CNI would write to
// if the node namespace leaked; Down --check reports any that appeared.
var hostPaths = []string{"/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/var/lib/cni", "/etc/cni/net.d",
	"/var/log/pods", "/var/log/containers", DataRoot, "/run/netns", "/var/run/netns", "/etc/kubernetes", "/opt/cni"}

// controlPlane is stopped in this order (the node side first).
var controlPlane = []string{"floor-provisioner", "floor", "snapshot-controller", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"}

// Down stops the cluster of the work folder: it deletes the pods, volume
// snapshots and PVCs (so localdir unmounts and deletes volumes the normal
// way) when the cluster still answers, stops every process it started
// (and every process left in the node namespace or in the pods' cgroups),
// detaches leftover loop devices, removes the pods' cgroups and the CNI
// bridge. With check it then fails if anything is left: a process, a mount
// or loop device of the work folder, the bridge, a cgroup, a file in a host
// path. The work folder stays for its logs.
func (c *Cluster) Down(ctx context.Context, check bool) error {
	var errs []error
	if _, err := os.Stat(c.Work); err == nil {
		// The cgroups, bridges and nftables table have the same names in
		// every checkout: with nothing of this work folder running, a
		// cluster that holds them is another checkout's, and stopping
		// "ours" would kill its pods and take its network.
		if len(c.ownRunning()) == 0 {
			if why := c.host.inUse(); len(why) > 0 {
				return fmt.Errorf("nothing of %s runs, but another cluster does (%s): stop it with `make demo-down` in the checkout that started it",
					c.Work, strings.Join(why, ", "))
			}
		}
		t0 := time.Now()
		if n := c.recordedNodes(); n > 0 {
			c.setNodes(n)
		}
		if c.Running("kube-apiserver") && c.allKubeletsRun() {
			if err := c.deleteWorkloads(ctx); err != nil {
				c.Logf("· deleting workloads: %v (stopping anyway)", err)
			} else if err := c.waitFor(ctx, "the volumes' loop devices to be detached", 30*time.Second, func() (bool, error) {
				return len(volumeLoops(c.Work)) == 0, nil
			}); err != nil {
				// Every volume was deleted the normal way (its pods gone,
				// unstaged): a loop device of one still attached is
				// localdir's leak.
				errs = append(errs, fmt.Errorf("%w: %s", err, strings.Join(volumeLoops(c.Work), ", ")))
			}
		}
		errs = append(errs, c.stopAll())
		c.Logf("· cluster stopped in %.1fs", time.Since(t0).Seconds())
	}
	if check {
		if leaks := c.Leaks(); len(leaks) > 0 {
			errs = append(errs, fmt.Errorf("left behind after teardown:\n  %s", strings.Join(leaks, "\n  ")))
		} else {
			c.Logf("· nothing left behind: no process, mount, loop device, bridge, cgroup or host file of the cluster")
		}
	}
	return errors.Join(errs...)
}

// ownRunning names the processes of the work folder's pid files that
// still run.
func (c *Cluster) ownRunning() []string {
	files, _ := filepath.Glob(filepath.Join(c.Work, "pids", "*.pid"))
	var out []string
	for _, f := range files {
		if name := strings.TrimSuffix(filepath.Base(f), ".pid"); c.Running(name) {
			out = append(out, name)
		}
	}
	return out
}

// allKubeletsRun tells whether every node's kubelet runs (pods can then
// be deleted the normal way).
func (c *Cluster) allKubeletsRun() bool {
	for _, n := range c.Nodes {
		if !c.Running(n.proc("kubelet")) {
			return false
		}
	}
	return true
}

// deleteWorkloads deletes what users and tests created, bounded in time.
func (c *Cluster) deleteWorkloads(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// Not localdir's own pods: they delete the volumes next.
	if _, err := c.Kubectl(ctx, "", "delete", "pods", "--all-namespaces", "--field-selector=metadata.namespace!=localdir",
		"--grace-period=1", "--wait=true", "--timeout=90s"); err != nil {
		return err
	}
	_, _ = c.Kubectl(ctx, "", "delete", "volumesnapshots", "--all", "--all-namespaces", "--wait=true", "--timeout=60s")
	if _, err := c.Kubectl(ctx, "", "delete", "pvc", "--all", "--all-namespaces", "--wait=true", "--timeout=60s"); err != nil {
		return err
	}
	// PVs with reclaim policy Delete go once localdir deleted their volume.
	return c.waitFor(ctx, "PVs to be deleted", 90*time.Second, func() (bool, error) {
		out, err := c.Kubectl(ctx, "", "get", "pv", "-o", "jsonpath={.items[?(@.spec.persistentVolumeReclaimPolicy==\"Delete\")].metadata.name}")
		return err == nil && out == "", nil
	})
}

func (c *Cluster) stopAll() error {
	var errs []error
	// Containers, shims and containerd: everything in each node's
	// namespaces or in its pods' cgroups.
	for _, n := range c.Nodes {
		errs = append(errs, n.stopProcesses())
	}
	// Loop devices of raw block volumes whose pods were not deleted (the
	// driver's, and the kubelet's own over their device nodes): detached
	// while the namespaces still exist, because their backing files are
	// named by their paths in them (/var/lib/localdir/..., /var/lib/kubelet/...)
	// only as long as they do. The data roots' own loop devices are
	// auto-cleared once their filesystems go with the namespaces.
	base := c.baseline()
	detachLoops(c.ourLoops(base), c.Logf)
	for _, n := range c.Nodes {
		errs = append(errs, n.stopNamespace())
	}
	for _, n := range controlPlane {
		errs = append(errs, c.stop(n, 10*time.Second))
	}
	_ = c.waitFor(context.Background(), "loop devices to clear", 20*time.Second, func() (bool, error) {
		detachLoops(c.ourLoops(base), func(string, ...any) {})
		return len(c.ourLoops(base)) == 0, nil
	})
	errs = append(errs, c.host.remove())
	return errors.Join(errs...)
}

// detachLoops detaches the loop devices of "loopN <file>" lines, the
// kubelet's (over a device node) first; a device still open is cleared by
// the kernel when its last user closes it.
func detachLoops(loops []string, logf func(string, ...any)) {
	sort.SliceStable(loops, func(i, j int) bool {
		return strings.Contains(loops[i], " /var/lib/kubelet/") && !strings.Contains(loops[j], " /var/lib/kubelet/")
	})
	for _, l := range loops {
		dev := "/dev/" + strings.SplitN(l, " ", 2)[0]
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			logf("· detach %s: %v", dev, err)
		}
		unix.Close(fd)
	}
}

// Leaks lists what the cluster left on the host.
func (c *Cluster) Leaks() []string {
	var out []string
	if n := c.recordedNodes(); n > 0 {
		c.setNodes(n)
	}
	for _, n := range c.Nodes {
		for _, pid := range procsIn(n.mntns(), "/"+n.cgroupRoot()+"/") {
			out = append(out, fmt.Sprintf("process %d in node %s's namespace or pod cgroups: %s", pid, n.Name, cmdline(pid)))
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		// Every process of the cluster names a file of the work folder in
		// its arguments, or runs in the node namespace (checked above).
		// The same binaries may run elsewhere (tests/cluster's envtest):
		// those are not ours.
		if cl := cmdline(pid); strings.Contains(cl, c.Work+"/") {
			out = append(out, fmt.Sprintf("process %d: %s", pid, cl))
		}
	}
	for _, m := range mountsUnder(c.Work) {
		out = append(out, "mount "+m)
	}
	for _, l := range c.ourLoops(c.baseline()) {
		out = append(out, "loop device "+l)
	}
	out = append(out, c.host.left()...)
	base := c.baseline()
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil && !contains(base.HostPaths, p) {
			out = append(out, "host path "+p)
		}
	}
	return out
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func (c *Cluster) baseline() state {
	var s state
	b, err := os.ReadFile(c.path("baseline.json"))
	if err != nil {
		// No record: assume every host path that exists now was there.
		for _, p := range hostPaths {
			if _, err := os.Lstat(p); err == nil {
				s.HostPaths = append(s.HostPaths, p)
			}
		}
		return s
	}
	_ = json.Unmarshal(b, &s)
	return s
}

// loopDevices lists attached loop devices as "loopN <backing file>".
func loopDevices() []string {
	var out []string
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		out = append(out, filepath.Base(filepath.Dir(filepath.Dir(m)))+" "+strings.TrimSpace(string(b)))
	}
	return out
}

// ourLoops are the loop devices backed by a file of the work folder or of
// the node's data root that were not there before Up.
func (c *Cluster) ourLoops(base state) []string {
	var out []string
	for _, l := range loopDevices() {
		f := strings.SplitN(l, " ", 2)
		if len(f) < 2 || contains(base.Loops, l) {
			continue
		}
		// Paths of the node namespace: the data root's image files, and
		// the kubelet's own loop device per mapped block volume.
		if strings.HasPrefix(f[1], c.Work+"/") || strings.HasPrefix(f[1], DataRoot+"/") || strings.HasPrefix(f[1], "/var/lib/kubelet/") {
			out = append(out, l)
		}
	}
	for _, l := range volumeLoops(c.Work) {
		if !contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// volumeLoops are the loop devices whose backing file lives on the
// filesystem of a data root of work (the node plugins' raw block and
// image volumes): found by the backing file's device (LOOP_GET_STATUS64),
// because once the mount namespace that attached one is gone the kernel
// names the file only by its path below the data root ("/block/…"). The
// devices are the data root images' loop devices (XFS) and the device
// numbers each node recorded for its data root at start (btrfs gives a
// subvolume a device number of its own).
func volumeLoops(work string) []string {
	roots := map[uint64]bool{}
	files, _ := filepath.Glob(filepath.Join(work, "nodes", "*", "dataroot-dev"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if d, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			roots[d] = true
		}
	}
	all := loopDevices()
	for _, l := range all {
		f := strings.SplitN(l, " ", 2)
		if len(f) == 2 && strings.HasPrefix(f[1], work+"/") {
			b, err := os.ReadFile("/sys/block/" + f[0] + "/dev")
			var major, minor uint32
			if _, scanErr := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &major, &minor); err == nil && scanErr == nil {
				roots[unix.Mkdev(major, minor)] = true
			}
		}
	}
	var out []string
	for _, l := range all {
		name := strings.SplitN(l, " ", 2)[0]
		fd, err := unix.Open("/dev/"+name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && roots[info.Device] {
			out = append(out, l)
		}
	}
	return out
}

// mountsUnder lists the host's mount points at or under dir.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fs[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// cgroupHierarchies are the cgroup v1 hierarchies under /sys/fs/cgroup.
func cgroupHierarchies() []string {
	ms, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	var out []string
	for _, m := range ms {
		d := filepath.Dir(m)
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Type == unix.CGROUP_SUPER_MAGIC {
			out = append(out, d)
		}
	}
	return out
}

// mkCgroupRoot makes a kubelet's cgroupRoot (a path relative to the
// hierarchies' roots) and its parents in every v1 hierarchy (the kubelet
// requires it to exist); a new cpuset starts empty, so each level gets
// its parent's CPUs and memory nodes.
func mkCgroupRoot(root string) error {
	for _, h := range cgroupHierarchies() {
		parent := h
		for _, part := range strings.Split(root, "/") {
			d := filepath.Join(parent, part)
			if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if b, err := os.ReadFile(filepath.Join(parent, f)); err == nil {
					if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
						return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
					}
				}
			}
			parent = d
		}
	}
	return nil
}

// rmCgroups removes cgroup trees, deepest first (a cgroup is removed with
// rmdir once it has no process and no child).
func rmCgroups(roots []string) error {
	var errs []error
	for _, r := range roots {
		var dirs []string
		_ = filepath.WalkDir(r, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 50; try++ {
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) || !errors.Is(err, syscall.EBUSY) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}
