package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// NodesBridge holds every node's address (10.254.0.<index+1>/32): the
// kubelets serve there, so the API server reaches each one at its Node's
// InternalIP (a kubelet refuses a loopback node IP). The pods' bridges are
// ldir-e2e<index>.
const NodesBridge = "ldir-e2e-nodes"

// Node is one node of the cluster: its own mount and PID namespace (PID 1
// is the pause binary, which reaps orphans; when it goes the kernel kills
// everything left in the namespace), containerd, kubelet, CNI bridge and
// pod subnet, kubelet root (/var/lib of the namespace is a folder of the
// work folder), cgroupRoot, data root on its own loop-mounted filesystem;
// the localdir-node DaemonSet runs its pod there. All nodes share the
// host's network namespace.
type Node struct {
	c *Cluster
	// Index counts from 0; Name is the Node object's name and localdir's
	// node id (the first node is "localhost", then "node2", "node3"…).
	Index int
	Name  string
	// FS is the data root's filesystem: btrfs on the first node (quotas
	// enforce sizes), xfs with reflink on the others (so engines mix);
	// "" when Options.DataRootSize is "0" (a plain folder).
	FS string

	restarts int       // the node plugin's restart count before KillPlugin
	stopped  time.Time // when KillPlugin or StopKubelet stopped it
}

func newNode(c *Cluster, i int) *Node {
	n := &Node{c: c, Index: i, Name: NodeName, FS: "btrfs"}
	if i > 0 {
		n.Name, n.FS = fmt.Sprintf("node%d", i+1), "xfs"
	}
	if c.DataRootSize == "0" {
		n.FS = ""
	}
	return n
}

// IP is the node's InternalIP, on NodesBridge.
func (n *Node) IP() string { return fmt.Sprintf("10.254.0.%d", n.Index+1) }

// MetricsAddress is where the node's localdir node plugin serves
// Prometheus metrics (its pod's IP, port 9810 of deploy/).
func (n *Node) MetricsAddress(ctx context.Context) (string, error) {
	ip, err := n.c.podIP(ctx, "node", n.Name)
	return ip + ":9810", err
}

func (n *Node) dir(p ...string) string {
	return n.c.path(append([]string{"nodes", n.Name}, p...)...)
}

// proc is the harness's name (pid file, log file) of the node's process base.
func (n *Node) proc(base string) string { return base + "-" + n.Name }

// cgroupRoot is the kubelet's cgroupRoot, under CgroupRoot.
func (n *Node) cgroupRoot() string { return CgroupRoot + "/" + n.Name }

// bridge is the CNI bridge of the node's pods (subnet 10.244.<index>.0/24).
func (n *Node) bridge() string { return fmt.Sprintf("ldir-e2e%d", n.Index) }

// init is the host pid of the node's PID 1 (the child of the unshare
// process the harness started), or an error when the node is not running.
func (n *Node) init() (int, error) {
	if pid := childOf(n.c.pidOf(n.proc("node-namespace"))); pid != 0 {
		return pid, nil
	}
	return 0, fmt.Errorf("node %s's namespace is not running", n.Name)
}

// childOf is the first child of pid (0 when there is none).
func childOf(pid int) int {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	c, _ := strconv.Atoi(f[0])
	return c
}

// enter is the nsenter prefix that runs a command in the node's mount and
// PID namespaces.
func (n *Node) enter() ([]string, error) {
	pid, err := n.init()
	if err != nil {
		return nil, err
	}
	return []string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", pid), fmt.Sprintf("--pid=/proc/%d/ns/pid", pid), "--"}, nil
}

// Output runs a command in the node's namespaces and returns its output.
func (n *Node) Output(ctx context.Context, argv ...string) (string, error) {
	pre, err := n.enter()
	if err != nil {
		return "", err
	}
	argv = append(pre, argv...)
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (on node %s): %v: %s", strings.Join(argv[len(pre):], " "), n.Name, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// Path is where the node's path p can be read from the host (through its
// PID 1's /proc/<pid>/root).
func (n *Node) Path(p string) string {
	pid, err := n.init()
	if err != nil {
		return "/nonexistent" + p
	}
	return fmt.Sprintf("/proc/%d/root%s", pid, p)
}

// mntns is the node's mount namespace ("mnt:[inode]"), as its PID 1 wrote it.
func (n *Node) mntns() string {
	b, _ := os.ReadFile(n.dir("mntns"))
	return strings.TrimSpace(string(b))
}

// mkdirs makes the node's folders in the work folder.
func (n *Node) mkdirs() error {
	for _, d := range []string{"var-lib/kubelet/plugins_registry", "var-lib/kubelet/plugins/" + DriverName, "var-log", "var-lib/localdir", "cni"} {
		if err := os.MkdirAll(n.dir(d), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// writeConfig writes the node's kubelet, CNI and containerd configuration.
func (n *Node) writeConfig(p *pki) error {
	c := n.c
	if err := p.issue("kubelet-"+n.Name, "system:node:"+n.Name, []string{"system:nodes"}, nil, nil); err != nil {
		return err
	}
	ca := p.path("ca.crt")
	write := func(name, content string) error { return os.WriteFile(n.dir(name), []byte(content), 0o600) }
	if err := write("kubeconfig", kubeconfig(c.Server(), ca, p.path("kubelet-"+n.Name+".crt"), p.path("kubelet-"+n.Name+".key"), "")); err != nil {
		return err
	}
	if err := write("kubelet.yaml", fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: %[2]d
healthzBindAddress: %[1]s
healthzPort: %[3]d
readOnlyPort: 0
tlsCertFile: %[4]s
tlsPrivateKeyFile: %[5]s
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %[6]s}
authorization: {mode: AlwaysAllow}
# This host has cgroup v1.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%[7]s
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# Imported images must never be collected, nothing evicted on a busy disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", nodefs.inodesFree: "1%%", imagefs.available: "1%%"}
serializeImagePulls: false
maxPods: 250
resolvConf: /etc/resolv.conf
kubeAPIQPS: 100
kubeAPIBurst: 200
`, n.IP(), kubeletPort, kubeletHealthPort, p.path("kubelet-serving.crt"), p.path("kubelet-serving.key"), ca, n.cgroupRoot())); err != nil {
		return err
	}
	if err := write("cni/10-localdir-e2e.conflist", fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "localdir-e2e",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.%d.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
`, n.bridge(), n.Index)); err != nil {
		return err
	}
	return write("containerd.toml", fmt.Sprintf(`# containerd 1.6 (Debian) inside the node's namespaces: /var/lib and /run
# are the work folder's and a tmpfs.
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  # This VM lacks CAP_SYS_RESOURCE: without this runc fails sandbox creation.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
`, PauseImage, n.dir("cni")))
}

// start sets up the node's namespaces and runs containerd and the kubelet
// in them; the images are imported from the OCI layouts in images.
func (n *Node) start(ctx context.Context) error {
	c := n.c
	img := ""
	if n.FS != "" {
		img = n.dir("localdir-" + n.FS + ".img")
		if err := run(ctx, "truncate", "-s", strings.TrimSuffix(strings.TrimSuffix(c.DataRootSize, "i"), "B"), img); err != nil {
			return err
		}
		mkfs := []string{"mkfs.btrfs", "-q", "-f", img}
		if n.FS == "xfs" {
			mkfs = []string{"mkfs.xfs", "-q", "-f", "-m", "reflink=1", img}
		}
		if err := run(ctx, mkfs...); err != nil {
			return err
		}
	}
	if err := mkCgroupRoot(n.cgroupRoot()); err != nil {
		return err
	}
	script := `set -e
mount -t tmpfs -o mode=0755 tmpfs /run
mount --bind "$D/var-lib" /var/lib
mount --bind "$D/var-log" /var/log
if [ -n "$IMG" ]; then mount -o loop "$IMG" ` + DataRoot + `; fi
# Shared within the node (still a slave of the host's): the node plugin's
# Bidirectional mounts under /var/lib/kubelet reach the kubelet.
mount --make-rshared /var/lib
readlink /proc/self/ns/mnt > "$D/mntns"
exec "$INIT"`
	// unshare forks the namespace's PID 1 (--kill-child: it dies with
	// unshare); --mount-proc gives the namespace its own /proc.
	if _, err := c.start(n.proc("node-namespace"), nil, []string{"D=" + n.dir(), "IMG=" + img, "INIT=" + c.tool("pause")},
		"unshare", "--mount", "--pid", "--kill-child", "--mount-proc", "--propagation", "slave", "/bin/sh", "-c", script); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "node "+n.Name+"'s namespace", 20*time.Second, func() (bool, error) {
		if !c.Running(n.proc("node-namespace")) {
			return false, fmt.Errorf("the namespace holder exited (see logs/%s.log)", n.proc("node-namespace"))
		}
		return n.mntns() != "", nil
	}); err != nil {
		return err
	}
	// The data root's device number, as its files report it (volumeLoops).
	var st syscall.Stat_t
	if err := syscall.Stat(n.Path(DataRoot), &st); err != nil {
		return err
	}
	if err := os.WriteFile(n.dir("dataroot-dev"), []byte(strconv.FormatUint(st.Dev, 10)+"\n"), 0o644); err != nil {
		return err
	}
	if _, err := c.start(n.proc("containerd"), n, nil, "containerd", "--config", n.dir("containerd.toml"), "--log-level", "warn"); err != nil {
		return err
	}
	if err := c.waitFor(ctx, "containerd on "+n.Name, 30*time.Second, func() (bool, error) {
		if !c.Running(n.proc("containerd")) {
			return false, fmt.Errorf("containerd exited (see logs/%s.log)", n.proc("containerd"))
		}
		_, err := n.Output(ctx, "ctr", "--address", "/run/containerd/containerd.sock", "version")
		return err == nil, nil
	}); err != nil {
		return err
	}
	if err := n.importImages(ctx); err != nil {
		return err
	}
	return n.startKubelet(ctx)
}

// startKubelet starts the node's kubelet and waits until the Node is Ready.
func (n *Node) startKubelet(ctx context.Context) error {
	c := n.c
	if _, err := c.start(n.proc("kubelet"), n, nil, c.tool("kubelet"),
		"--config="+n.dir("kubelet.yaml"), "--kubeconfig="+n.dir("kubeconfig"),
		"--hostname-override="+n.Name, "--node-ip="+n.IP(), "-v=1"); err != nil {
		return err
	}
	return c.waitFor(ctx, "node "+n.Name+" Ready", 90*time.Second, func() (bool, error) {
		if !c.Running(n.proc("kubelet")) {
			return false, fmt.Errorf("the kubelet exited (see logs/%s.log)", n.proc("kubelet"))
		}
		out, err := c.Kubectl(ctx, "", "get", "node", n.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True", nil
	})
}

// waitPlugin waits until the node's localdir pod registered the driver
// with the kubelet (CSINode lists it) and published its LocalNode.
func (n *Node) waitPlugin(ctx context.Context) error {
	return n.waitPluginSince(ctx, time.Time{})
}

// waitPluginSince is waitPlugin for a node plugin started after since:
// its LocalNode heartbeat is later than since (a second's precision; an
// older one is the previous plugin's) and its socket accepts connections.
func (n *Node) waitPluginSince(ctx context.Context, since time.Time) error {
	c := n.c
	what := "CSINode " + n.Name + " lists " + DriverName + " and LocalNode " + n.Name
	if !since.IsZero() {
		what += " with a heartbeat after " + since.Format(time.RFC3339) + ", the plugin's socket answering"
	}
	return c.waitFor(ctx, what, 2*time.Minute, func() (bool, error) {
		out, err := c.Kubectl(ctx, "", "get", "csinode", n.Name, "-o", "jsonpath={.spec.drivers[*].name}")
		if err != nil || !strings.Contains(out, DriverName) {
			return false, nil
		}
		hb, err := c.Kubectl(ctx, "", "get", "localnode", n.Name, "-o", "jsonpath={.status.heartbeat}")
		if err != nil {
			return false, nil
		}
		if since.IsZero() {
			return true, nil
		}
		t, err := time.Parse(time.RFC3339, hb)
		if err != nil || !t.After(since) {
			return false, nil
		}
		conn, err := net.DialTimeout("unix", n.Path(NodeSocket), time.Second)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
}

// nodePod is the name and UID of the node's localdir node pod and the
// restart count of its localdir container.
func (n *Node) nodePod(ctx context.Context) (name, uid string, restarts int, err error) {
	out, err := n.c.Kubectl(ctx, "", "get", "pods", "-n", "localdir", "-l", "app.kubernetes.io/component=node",
		"--field-selector=spec.nodeName="+n.Name, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.containerStatuses[?(@.name=="localdir")].restartCount}{"\n"}{end}`)
	if err != nil {
		return "", "", 0, err
	}
	f := strings.Fields(out)
	if len(f) != 3 {
		return "", "", 0, fmt.Errorf("want one localdir node pod on %s, have %q", n.Name, out)
	}
	restarts, err = strconv.Atoi(f[2])
	return f[0], f[1], restarts, err
}

// podProcs are the processes of the pod with uid on the node (all its
// containers, the sandbox's pause included).
func (n *Node) podProcs(uid string) []int {
	// cgroupfs: <cgroupRoot>/kubepods[/<class>]/pod<uid>/<container>.
	return filterCgroup(procsIn("", "/"+n.cgroupRoot()+"/kubepods/"), "/pod"+uid+"/")
}

// KillPlugin kills the node plugin (the localdir container of the node's
// pod) with SIGKILL, as a crash would; the kubelet restarts the container.
// WaitPluginRestarted waits for that.
func (n *Node) KillPlugin(ctx context.Context) error {
	_, uid, restarts, err := n.nodePod(ctx)
	if err != nil {
		return err
	}
	var pids []int
	for _, pid := range n.podProcs(uid) {
		if strings.Contains(cmdline(pid), "--mode=node") {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		return fmt.Errorf("node %s: want one node plugin process in pod %s, found %v", n.Name, uid, pids)
	}
	n.restarts, n.stopped = restarts, time.Now()
	return killAll(pids)
}

// WaitPluginRestarted waits until the kubelet restarted the node plugin
// KillPlugin killed, the container is Ready and the driver registered.
func (n *Node) WaitPluginRestarted(ctx context.Context) error {
	if err := n.c.waitFor(ctx, "the node plugin on "+n.Name+" restarted and Ready", 2*time.Minute, func() (bool, error) {
		name, _, restarts, err := n.nodePod(ctx)
		if err != nil || restarts <= n.restarts {
			return false, nil
		}
		out, err := n.c.Kubectl(ctx, "", "get", "pod", "-n", "localdir", name, "-o",
			`jsonpath={.status.containerStatuses[?(@.name=="localdir")].ready}`)
		return err == nil && out == "true", nil
	}); err != nil {
		return err
	}
	return n.waitPluginSince(ctx, n.stopped)
}

// StopKubelet stops the node's kubelet, then kills the processes of its
// localdir node pod (node plugin, registrar, livenessprobe) with SIGKILL,
// as when a node goes away; the node's other containers keep running.
// StartKubelet brings them back: the kubelet restarts the pod.
func (n *Node) StopKubelet(ctx context.Context) error {
	c := n.c
	n.stopped = time.Now()
	if err := c.stop(n.proc("kubelet"), 10*time.Second); err != nil {
		return err
	}
	_, uid, _, err := n.nodePod(ctx)
	if err != nil {
		return err
	}
	pids := n.podProcs(uid)
	if len(pids) == 0 {
		return fmt.Errorf("node %s: no process of its localdir pod %s found", n.Name, uid)
	}
	return killAll(pids)
}

// StartKubelet starts the kubelet StopKubelet stopped and waits until the
// node is Ready and its localdir pod, restarted by the kubelet, registered
// the driver and wrote a heartbeat again.
func (n *Node) StartKubelet(ctx context.Context) error {
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	return n.waitPluginSince(ctx, n.stopped)
}

// stopProcesses stops the node's daemons, then every process left in its
// mount namespace or its pods' cgroups, but its PID 1.
func (n *Node) stopProcesses() error {
	c := n.c
	errs := []error{c.stop(n.proc("kubelet"), 10*time.Second)}
	// The stand-in driver's node service and registration, if started.
	errs = append(errs, c.stop(n.proc("floor-registrar"), 5*time.Second), c.stop(n.proc("floor-node"), 5*time.Second))
	errs = append(errs, c.stop(n.proc("containerd"), 5*time.Second))
	// unshare (in the namespace's mount namespace too) and PID 1 stay: when
	// either goes, the namespaces go, and the loop devices are detached
	// while they exist (Cluster.stopAll).
	holder := c.pidOf(n.proc("node-namespace"))
	init := childOf(holder)
	for i := 0; i < 3; i++ {
		var pids []int
		for _, pid := range procsIn(n.mntns(), "/"+n.cgroupRoot()+"/") {
			if pid != init && pid != holder {
				pids = append(pids, pid)
			}
		}
		errs = append(errs, killAll(pids))
	}
	return errors.Join(errs...)
}

// stopNamespace ends the node's namespaces (their mounts go with them).
func (n *Node) stopNamespace() error {
	errs := []error{n.c.stop(n.proc("node-namespace"), 5*time.Second)}
	errs = append(errs, killAll(procsIn(n.mntns(), "/"+n.cgroupRoot()+"/")))
	return errors.Join(errs...)
}

// nodesFile records how many nodes Up started, for a later Down.
func (c *Cluster) nodesFile() string { return c.path("nodes", "count") }

// setNodes makes the cluster's node list of count nodes.
func (c *Cluster) setNodes(count int) {
	if count < 1 {
		count = 1
	}
	c.Nodes = nil
	for i := 0; i < count; i++ {
		c.Nodes = append(c.Nodes, newNode(c, i))
	}
}

// recordedNodes is the node count Up recorded in the work folder (0: none).
func (c *Cluster) recordedNodes() int {
	b, err := os.ReadFile(c.nodesFile())
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// NodesFromEnv is E2E_NODES (default 1): how many nodes `e2e-cluster up`
// (`make demo`) starts; `make e2e` and `make e2e-k8s` set 2 unless it is
// set.
func NodesFromEnv() (int, error) {
	v := os.Getenv("E2E_NODES")
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 9 {
		return 0, fmt.Errorf("E2E_NODES=%q: want a number of nodes from 1 to 9", v)
	}
	return n, nil
}

// startNodesBridge creates NodesBridge with every node's address.
func (c *Cluster) startNodesBridge(ctx context.Context) error {
	if err := run(ctx, "ip", "link", "add", NodesBridge, "type", "bridge"); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := run(ctx, "ip", "addr", "add", n.IP()+"/32", "dev", NodesBridge); err != nil {
			return err
		}
	}
	if err := run(ctx, "ip", "link", "set", NodesBridge, "up"); err != nil {
		return err
	}
	return c.addAPIServiceRule(ctx)
}

// apiServiceTable is the nftables table (family ip) of the rules that let
// pods reach the API server: there is no kube-proxy, so a connection from
// a pod bridge to the kubernetes Service (10.0.0.1:443, which in-cluster
// clients dial) is redirected to the API server's port on that bridge's
// address; the API server listens on every address for that, and the
// second rule keeps its port closed to all but loopback and the pod
// bridges. Down deletes the table.
const apiServiceTable = "localdir_e2e"

func (c *Cluster) addAPIServiceRule(ctx context.Context) error {
	rules := fmt.Sprintf(`table ip %[1]s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "ldir-e2e*" ip daddr 10.0.0.1 tcp dport 443 redirect to :%[2]d
	}
	chain input {
		type filter hook input priority filter; policy accept;
		tcp dport %[2]d iifname != "lo" iifname != "ldir-e2e*" drop
	}
}
`, apiServiceTable, APIServerPort)
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %v: %s", err, out)
	}
	return nil
}

// CutPodNetwork drops every packet between the pods of nodes a and b, both
// ways (a forward chain of apiServiceTable, which Down deletes with the
// table), until heal removes the chain.
func (c *Cluster) CutPodNetwork(ctx context.Context, a, b *Node) (heal func() error, err error) {
	rules := fmt.Sprintf(`table ip %[1]s {
	chain cut {
		type filter hook forward priority filter; policy accept;
		ip saddr 10.244.%[2]d.0/24 ip daddr 10.244.%[3]d.0/24 drop
		ip saddr 10.244.%[3]d.0/24 ip daddr 10.244.%[2]d.0/24 drop
	}
}
`, apiServiceTable, a.Index, b.Index)
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nft -f: %v: %s", err, out)
	}
	return func() error {
		if err := run(context.Background(), "nft", "flush", "chain", "ip", apiServiceTable, "cut"); err != nil {
			return err
		}
		return run(context.Background(), "nft", "delete", "chain", "ip", apiServiceTable, "cut")
	}, nil
}
