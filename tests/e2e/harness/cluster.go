// Package harness brings up a whole Kubernetes cluster on this machine
// (control plane on 127.0.0.1, kubelets on 10.254.0.<i+1>) for localdir's
// end-to-end tests and `make demo`, from binaries built out of
// Go modules (`make e2e-tools`) and Debian packages, and tears it down
// leaving nothing behind.
//
// Control plane, on the host: etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler and the snapshot-controller add-on.
//
// The nodes (Options.Nodes, E2E_NODES; node.go), each in a mount and PID
// namespace of its own (unshare --mount --pid --mount-proc --propagation
// slave, PID 1 the pause binary: tmpfs on /run, bind mounts of folders of
// the work folder over /var/lib (made rshared, for the Bidirectional
// mounts of the node plugin) and /var/log, and the data root
// /var/lib/localdir on a loop-mounted image: btrfs on the first node
// "localhost", XFS with reflink on "node2", "node3"…): containerd with
// runc and the CNI bridge plugin, and the kubelet. Every mount made there
// goes away with the namespace.
//
// localdir itself is installed from deploy/kubernetes as a user would
// (kubectl apply --server-side -k, CRDs first): its Deployment and
// DaemonSet run as pods, from images built offline (images.go: localdir's
// from the Dockerfile's build command and packages, the sidecars from
// their modules, stand-ins for the registrar and livenessprobe under the
// real names). The only change is an overlay with shorter timings for the
// tests (installOverlay). Pods reach the API server at the kubernetes
// Service's address through one nftables rule (apiServiceTable).
package harness

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Ports on 127.0.0.1. Not the defaults, so that a cluster already on this
// machine does not collide.
const (
	EtcdPort      = 23790
	etcdPeerPort  = 23800
	APIServerPort = 16443
	kcmPort       = 20257
	schedulerPort = 20259
	// The kubelets' ports, on each node's own IP (Node.IP).
	kubeletPort       = 20250
	kubeletHealthPort = 20248
	snapshotCtlPort   = 20280

	// NodeName is the first node's name and localdir node id.
	NodeName = "localhost"
	// DriverName is localdir's CSI driver name.
	DriverName = "localdir.csi.dev"
	// DataRoot is the node plugin's --data-root inside the node namespace
	// (the DaemonSet's default).
	DataRoot = "/var/lib/localdir"
	// CgroupRoot holds the kubelets' cgroupRoots (CgroupRoot/<node>):
	// every pod cgroup lives under it, in each cgroup v1 hierarchy.
	CgroupRoot = "localdir-e2e"
	// BusyboxImage and PauseImage are the images built offline and
	// imported into containerd.
	BusyboxImage = "docker.io/library/busybox:1.35"
	PauseImage   = "registry.k8s.io/pause:3.10"
)

// Options say where things are and how the node is set up.
type Options struct {
	// Root is the repository root; Work the work folder (default
	// <Root>/_output/e2e), wiped by Up and the only place files are written.
	Root, Work string
	// DataRootSize is the size of the sparse btrfs image holding the data
	// root (default 8Gi); "" or "0" keeps the data root a plain folder.
	DataRootSize string
	// NodeCapacity is the node plugins' --capacity ("" = filesystem size).
	NodeCapacity string
	// Nodes is how many nodes to start (default 1; NodesFromEnv).
	Nodes int
	// SuiteImages also builds the images the Kubernetes e2e suite's
	// storage tests run (images.go; needs the agnhost binary of
	// `make e2e-k8s` in the tools folder).
	SuiteImages bool
	// Logf reports progress (default: stderr).
	Logf func(format string, args ...any)
}

// Cluster is a cluster in a work folder, running or not.
type Cluster struct {
	Options
	// Tools holds the binaries of `make e2e-tools`.
	Tools string
	// Kubeconfig is the admin kubeconfig (system:masters).
	Kubeconfig string
	// Nodes are the cluster's nodes, the first one NodeName.
	Nodes []*Node

	imageTars []imageTar
	// host names the host-wide parts (clusterHost; a test's own in tests).
	host hostParts
}

// New returns the cluster of o's work folder without starting anything.
func New(o Options) *Cluster {
	if o.Work == "" {
		o.Work = filepath.Join(o.Root, "_output", "e2e")
	}
	if o.DataRootSize == "" {
		o.DataRootSize = "8Gi"
	}
	if o.Logf == nil {
		o.Logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	}
	c := &Cluster{
		Options:    o,
		Tools:      filepath.Join(o.Root, "_output", "tools", "bin"),
		Kubeconfig: filepath.Join(o.Work, "kubeconfig"),
		host:       clusterHost,
	}
	c.setNodes(o.Nodes)
	return c
}

func (c *Cluster) path(p ...string) string { return filepath.Join(append([]string{c.Work}, p...)...) }
func (c *Cluster) tool(name string) string { return filepath.Join(c.Tools, name) }

// Server is the API server's URL.
func (c *Cluster) Server() string { return fmt.Sprintf("https://127.0.0.1:%d", APIServerPort) }

// NodeSocket is the node plugin's socket inside the node namespace (where
// the DaemonSet's hostPath puts it).
const NodeSocket = "/var/lib/kubelet/plugins/" + DriverName + "/csi.sock"

// Up wipes the work folder (stopping what a previous run left), starts the
// whole cluster and waits until it is ready: Node Ready, localdir
// registered on it, LocalNode and CSIStorageCapacity published, the
// default ServiceAccount there.
func (c *Cluster) Up(ctx context.Context) (err error) {
	t0 := time.Now()
	if err := c.preflight(); err != nil {
		return err
	}
	if _, statErr := os.Stat(c.Work); statErr == nil {
		c.Logf("· stopping what a previous run left in %s", c.Work)
		if err := c.Down(ctx, false); err != nil {
			return fmt.Errorf("clean up the previous run: %w", err)
		}
		// Down stopped the previous run's nodes; this run starts its own.
		c.setNodes(c.Options.Nodes)
	}
	// A run killed in another checkout leaves bridges, the nftables table
	// and cgroups that the Down above does not know of.
	if err := c.host.reclaim(c.Logf); err != nil {
		return err
	}
	if taken := c.host.takenPorts(); len(taken) > 0 {
		return fmt.Errorf("%s (another cluster running? `make demo-down` in the checkout that started it)", strings.Join(taken, ", "))
	}
	if err := c.wipe(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, c.path("logs"))
		}
	}()
	if err := c.recordBaseline(); err != nil {
		return err
	}
	if err := c.runSteps(ctx, []step{
		{"certificates and kubeconfigs", c.writeConfig},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"kube-controller-manager, kube-scheduler", c.startControllers},
		{"snapshot CRDs, snapshot-controller", c.startSnapshotController},
		{"images (OCI layouts; localdir's from the Dockerfile)", c.buildImages},
		{fmt.Sprintf("%d node(s): namespaces, containerd, images, kubelet", len(c.Nodes)), c.startNodes},
		{"localdir from deploy/kubernetes (kubectl apply -k)", c.install},
		{"localdir pods Running, driver registered, cluster ready", c.waitReady},
	}); err != nil {
		return err
	}
	c.Logf("· cluster up in %.1fs", time.Since(t0).Seconds())
	return nil
}

// preflight checks the binaries and the commands the harness runs.
func (c *Cluster) preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("the end-to-end cluster needs root (mounts, containers, loop devices)")
	}
	var missing []string
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl",
		"csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter", "snapshot-controller", "registrar", "livenessprobe", "snapshot-metadata", "pause", "helm"} {
		if _, err := os.Stat(c.tool(b)); err != nil {
			missing = append(missing, c.tool(b))
		}
	}
	if c.SuiteImages {
		if _, err := os.Stat(c.tool("agnhost")); err != nil {
			missing = append(missing, c.tool("agnhost")+" (make e2e-k8s)")
		}
		for _, p := range []string{"/bin/dd", "/bin/dash", "/usr/bin/ldd"} {
			if _, err := os.Stat(p); err != nil {
				missing = append(missing, p)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(c.Root, "_output", "tools", "snapshot-crds")); err != nil {
		missing = append(missing, "_output/tools/snapshot-crds")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing (run `make build e2e-tools`): %s", strings.Join(missing, ", "))
	}
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc", "umoci", "unshare", "nsenter", "mkfs.btrfs", "mkfs.xfs", "ip", "nft", "dpkg", "go"} {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		missing = append(missing, "/usr/lib/cni/bridge")
	}
	if _, err := os.Stat("/bin/busybox"); err != nil {
		missing = append(missing, "/bin/busybox")
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing commands (apt-get install containerd runc containernetworking-plugins umoci busybox-static btrfs-progs xfsprogs iproute2 util-linux nftables; go): %s", strings.Join(missing, ", "))
	}
	for _, p := range []string{"/var/lib", "/var/log", "/run", "/var/run"} {
		if c.Work == p || strings.HasPrefix(c.Work, p+"/") {
			return fmt.Errorf("the work folder %s must not be under %s (the node namespace hides it)", c.Work, p)
		}
	}
	return nil
}

// wipe removes the work folder, refusing if anything is mounted under it.
func (c *Cluster) wipe() error {
	if ms := mountsUnder(c.Work); len(ms) > 0 {
		return fmt.Errorf("still mounted under %s: %s", c.Work, strings.Join(ms, ", "))
	}
	if err := os.RemoveAll(c.Work); err != nil {
		return err
	}
	for _, d := range []string{"logs", "pids", "tmp", "etcd", "images", "install"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	for _, n := range c.Nodes {
		if err := n.mkdirs(); err != nil {
			return err
		}
	}
	return os.WriteFile(c.nodesFile(), []byte(fmt.Sprintf("%d\n", len(c.Nodes))), 0o644)
}

// writeConfig writes certificates, kubeconfigs and component configs.
func (c *Cluster) writeConfig(context.Context) error {
	p, err := newPKI(c.path("pki"))
	if err != nil {
		return err
	}
	lo := []net.IP{net.ParseIP("127.0.0.1")}
	for _, x := range []struct {
		name, cn string
		orgs     []string
		dns      []string
		ips      []net.IP
	}{
		{"apiserver", "kube-apiserver", nil, []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, append(lo, net.ParseIP("10.0.0.1"))},
		{"admin", "admin", []string{"system:masters"}, nil, nil},
		{"kubelet-serving", NodeName, nil, c.nodeNames(), c.nodeIPs()},
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil},
		{"serving", "localdir-e2e", nil, []string{"localhost"}, lo},
	} {
		if err := p.issue(x.name, x.cn, x.orgs, x.dns, x.ips); err != nil {
			return err
		}
	}
	ca := p.path("ca.crt")
	write := func(name, content string) error { return os.WriteFile(c.path(name), []byte(content), 0o600) }
	if err := write("kubeconfig", kubeconfig(c.Server(), ca, p.path("admin.crt"), p.path("admin.key"), "")); err != nil {
		return err
	}
	if err := write("scheduler.yaml", fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
  qps: 200
  burst: 300
leaderElection:
  leaderElect: false
`, c.Kubeconfig)); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.writeConfig(p); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	if _, err := c.start("etcd", nil, nil, c.tool("etcd"),
		"--name=e2e", "--data-dir="+c.path("etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", EtcdPort),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", EtcdPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", etcdPeerPort),
		fmt.Sprintf("--initial-cluster=e2e=http://127.0.0.1:%d", etcdPeerPort),
		"--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "etcd", fmt.Sprintf("http://127.0.0.1:%d/health", EtcdPort), `"health":"true"`)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	p := c.path("pki")
	if _, err := c.start("kube-apiserver", nil, nil, c.tool("kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", EtcdPort),
		// Every address: the pods reach it through the kubernetes
		// Service's address, redirected to their bridge's (apiServiceTable).
		"--bind-address=0.0.0.0", "--advertise-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--tls-cert-file="+filepath.Join(p, "apiserver.crt"), "--tls-private-key-file="+filepath.Join(p, "apiserver.key"),
		"--client-ca-file="+filepath.Join(p, "ca.crt"),
		"--kubelet-client-certificate="+filepath.Join(p, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key="+filepath.Join(p, "apiserver-kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+filepath.Join(p, "sa.pub"),
		"--service-account-signing-key-file="+filepath.Join(p, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		// Loopback endpoints for the kubernetes Service are rejected.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
		// A PV's node affinity may change: localdir's in-place volume
		// move (alpha in v1.37, off by default).
		"--feature-gates=MutablePVNodeAffinity=true",
		"-v=1"); err != nil {
		return err
	}
	return c.waitHTTP(ctx, "kube-apiserver", c.Server()+"/readyz", "ok")
}

func (c *Cluster) startControllers(ctx context.Context) error {
	p := c.path("pki")
	if _, err := c.start("kube-controller-manager", nil, nil, c.tool("kube-controller-manager"),
		"--kubeconfig="+c.Kubeconfig, "--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", kcmPort), "--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(p, "sa.key"),
		"--root-ca-file="+filepath.Join(p, "ca.crt"),
		"--cluster-signing-cert-file="+filepath.Join(p, "ca.crt"), "--cluster-signing-key-file="+filepath.Join(p, "ca.key"),
		"--use-service-account-credentials=false",
		"--controllers=*",
		// The notes measured binding 100 PVCs: the defaults (20/30) hold it.
		"--kube-api-qps=200", "--kube-api-burst=300",
		// A node whose kubelet stops is NotReady (and tainted) after 20 s,
		// not 50: the scenario of a node going away waits for it.
		"--node-monitor-grace-period=20s",
		"-v=1"); err != nil {
		return err
	}
	_, err := c.start("kube-scheduler", nil, nil, c.tool("kube-scheduler"),
		"--config="+c.path("scheduler.yaml"),
		"--authentication-kubeconfig="+c.Kubeconfig, "--authorization-kubeconfig="+c.Kubeconfig,
		"--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", schedulerPort), "-v=1")
	return err
}

// install installs localdir as docs/install.md says: its CRDs first
// (waiting until they are served), then `kubectl apply --server-side -k`
// of deploy/kubernetes through installOverlay, Deployment and DaemonSet
// included.
func (c *Cluster) install(ctx context.Context) error {
	if _, err := c.Kubectl(ctx, "", "apply", "--server-side", "-f", filepath.Join(c.Root, "deploy", "kubernetes", "crds")); err != nil {
		return err
	}
	if _, err := c.Kubectl(ctx, "", "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"); err != nil {
		return err
	}
	dir, err := c.installOverlay()
	if err != nil {
		return err
	}
	_, err = c.Kubectl(ctx, "", "apply", "--server-side", "-k", dir)
	return err
}

// installOverlay writes the kustomization the cluster installs: deploy/kubernetes
// as it is, with only the tests' timings added, and returns its folder.
// The node plugins heartbeat every HeartbeatInterval and the controller
// counts a node gone after NodeStaleAfter (a test of a node going away
// waits half a minute, not three); csi-provisioner polls capacity every
// 3 s, not every minute (tests of capacity see a change at once); with
// Options.NodeCapacity, the node plugins' --capacity.
func (c *Cluster) installOverlay() (string, error) {
	dir := c.path("install")
	base, err := filepath.Rel(dir, filepath.Join(c.Root, "deploy", "kubernetes"))
	if err != nil {
		return "", err
	}
	nodeArgs := []string{"--heartbeat-interval=" + HeartbeatInterval}
	if c.NodeCapacity != "" {
		nodeArgs = append(nodeArgs, "--capacity="+c.NodeCapacity)
	}
	add := func(container int, args ...string) string {
		var b strings.Builder
		for _, a := range args {
			fmt.Fprintf(&b, "      - {op: add, path: /spec/template/spec/containers/%d/args/-, value: %q}\n", container, a)
		}
		return b.String()
	}
	k := fmt.Sprintf(`# Written by the end-to-end harness (installOverlay): deploy/kubernetes
# with the tests' shorter timings.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
patches:
  - target: {kind: DaemonSet, name: localdir-node}
    patch: |-
%s  - target: {kind: Deployment, name: localdir-controller}
    patch: |-
%s%s`, base, add(0, nodeArgs...), add(0, "--node-stale-after="+NodeStaleAfter), add(1, "--capacity-poll-interval=3s"))
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// startNodes starts every node (nodesBridge first), one after another.
func (c *Cluster) startNodes(ctx context.Context) error {
	if err := c.startNodesBridge(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.start(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

// HeartbeatInterval and NodeStaleAfter are the node plugins'
// --heartbeat-interval and the controller's --node-stale-after here
// (installOverlay): shorter than deploy/'s (30s, 3m), so that a test sees a
// node plugin that went away counted as gone within half a minute.
const (
	HeartbeatInterval = "5s"
	NodeStaleAfter    = "30s"
)

// ProvisionerLease is csi-provisioner's leader-election Lease in namespace
// localdir: the driver name with '.' as '-' (the other sidecars' start with
// "external-").
const ProvisionerLease = "localdir-csi-dev"

// ControllerMetricsAddress is where the localdir controller pod whose
// csi-provisioner leads (the holder of the Lease named after the driver)
// serves Prometheus metrics: its pod IP, port 9810 of deploy/. That pod's
// driver answers the CreateVolume calls.
func (c *Cluster) ControllerMetricsAddress(ctx context.Context) (string, error) {
	holder, err := c.Kubectl(ctx, "", "get", "lease", "-n", "localdir", ProvisionerLease, "-o", "jsonpath={.spec.holderIdentity}")
	if err != nil {
		return "", err
	}
	ip, err := c.Kubectl(ctx, "", "get", "pod", "-n", "localdir", strings.TrimSpace(holder), "-o", "jsonpath={.status.podIP}")
	if err != nil {
		return "", err
	}
	if ip = strings.TrimSpace(ip); ip == "" {
		return "", fmt.Errorf("the csi-provisioner leader %q has no pod IP", holder)
	}
	return ip + ":9810", nil
}

// podIP is the IP of the running localdir pod of component ("controller"
// or "node"), on node when it is not "".
func (c *Cluster) podIP(ctx context.Context, component, node string) (string, error) {
	sel := "app.kubernetes.io/name=localdir,app.kubernetes.io/component=" + component
	args := []string{"get", "pods", "-n", "localdir", "-l", sel, "--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].status.podIP}"}
	if node != "" {
		args[len(args)-3] += ",spec.nodeName=" + node
	}
	out, err := c.Kubectl(ctx, "", args...)
	if err != nil {
		return "", err
	}
	ips := strings.Fields(out)
	if len(ips) != 1 {
		return "", fmt.Errorf("want one running localdir %s pod (node %q), have IPs %q", component, node, out)
	}
	return ips[0], nil
}

// waitSocket waits until the daemon name (what, in errors) accepts
// connections on its socket sock (a socket file left by a killed process
// does not), and fails at once when it exits.
func (c *Cluster) waitSocket(ctx context.Context, name, what, sock string) error {
	return c.waitFor(ctx, what+"'s socket", 30*time.Second, func() (bool, error) {
		if !c.Running(name) {
			return false, fmt.Errorf("%s exited (see logs/%s.log)", what, name)
		}
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err != nil {
			return false, nil
		}
		conn.Close()
		return true, nil
	})
}

// nodeNames and nodeIPs list the nodes' names and IPs (with 127.0.0.1).
func (c *Cluster) nodeNames() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Name)
	}
	return out
}

func (c *Cluster) nodeIPs() []net.IP {
	out := []net.IP{net.ParseIP("127.0.0.1")}
	for _, n := range c.Nodes {
		out = append(out, net.ParseIP(n.IP()))
	}
	return out
}

// SnapshotMetadataCRD is the SnapshotMetadataService CRD the tests install
// (relative to the repository).
const SnapshotMetadataCRD = "tests/cluster/snapshotmetadata/testdata/crd/snapshotmetadataservices.yaml"

// startSnapshotController applies the snapshot CRDs and runs the
// snapshot-controller: a cluster add-on, not part of localdir, run as a
// process on the host (as the control plane is).
func (c *Cluster) startSnapshotController(ctx context.Context) error {
	crds := filepath.Join(c.Root, "_output", "tools", "snapshot-crds")
	if _, err := c.Kubectl(ctx, "", "apply", "--server-side", "-f", crds); err != nil {
		return err
	}
	// The SnapshotMetadataService CRD of external-snapshot-metadata (the
	// tests' own, written from its published API), so the controller
	// publishes changed block tracking as in a cluster that has it.
	if _, err := c.Kubectl(ctx, "", "apply", "--server-side", "-f", filepath.Join(c.Root, SnapshotMetadataCRD)); err != nil {
		return err
	}
	_, err := c.start("snapshot-controller", nil, nil, c.tool("snapshot-controller"), "--kubeconfig="+c.Kubeconfig,
		"--leader-election=false", "--v=2", fmt.Sprintf("--http-endpoint=127.0.0.1:%d", snapshotCtlPort),
		"--kube-api-qps=200", "--kube-api-burst=300")
	return err
}

// waitReady waits for what a first PVC and pod need: the localdir pods
// Ready (the controller, one node pod on every node), the driver
// registered with every kubelet and its LocalNode published.
func (c *Cluster) waitReady(ctx context.Context) error {
	if err := c.waitPods(ctx); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := n.waitPlugin(ctx); err != nil {
			return err
		}
	}
	checks := []struct {
		what string
		f    func() (bool, error)
	}{
		{"kube-controller-manager healthz", func() (bool, error) { return c.httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort), "ok"), nil }},
		{"kube-scheduler healthz", func() (bool, error) {
			return c.httpOK(fmt.Sprintf("https://127.0.0.1:%d/healthz", schedulerPort), "ok"), nil
		}},
		{"snapshot-controller", func() (bool, error) {
			return c.httpOK(fmt.Sprintf("http://127.0.0.1:%d/metrics", snapshotCtlPort), ""), nil
		}},
		{"the default ServiceAccount", func() (bool, error) {
			_, err := c.Kubectl(ctx, "", "get", "serviceaccount", "default", "-n", "default")
			return err == nil, nil
		}},
		{"a CSIStorageCapacity per node for StorageClass localdir", func() (bool, error) {
			out, err := c.Kubectl(ctx, "", "get", "csistoragecapacities", "-n", "localdir", "-o",
				`jsonpath={range .items[?(@.storageClassName=="localdir")]}{.nodeTopology.matchLabels.topology\.localdir\.csi\.dev/node}{"\n"}{end}`)
			for _, n := range c.Nodes {
				if err != nil || !strings.Contains("\n"+out+"\n", "\n"+n.Name+"\n") {
					return false, nil
				}
			}
			return true, nil
		}},
	}
	for _, ch := range checks {
		f := ch.f
		if err := c.waitFor(ctx, ch.what, 90*time.Second, func() (bool, error) {
			for _, n := range []string{"snapshot-controller", "kube-controller-manager", "kube-scheduler"} {
				if !c.Running(n) {
					return false, fmt.Errorf("%s exited (see logs/%s.log)", n, n)
				}
			}
			return f()
		}); err != nil {
			return err
		}
	}
	return nil
}

// waitPods waits until `kubectl -n localdir get pods` shows as many
// controller pods as the controller Deployment's replicas and one node pod
// per node, every container Ready.
func (c *Cluster) waitPods(ctx context.Context) error {
	want := map[string]bool{"controller": true}
	for _, n := range c.Nodes {
		want["node/"+n.Name] = true
	}
	last := ""
	err := c.waitFor(ctx, "the localdir pods Ready", 3*time.Minute, func() (bool, error) {
		out, err := c.Kubectl(ctx, "", "get", "pods", "-n", "localdir", "-o",
			`jsonpath={range .items[*]}{.metadata.labels.app\.kubernetes\.io/component}/{.spec.nodeName} {.status.phase} {.status.containerStatuses[*].ready}{"\n"}{end}`)
		if err != nil {
			return false, nil
		}
		last = out
		replicas, err := c.Kubectl(ctx, "", "get", "deployments", "-n", "localdir", "-l", "app.kubernetes.io/component=controller",
			"-o", "jsonpath={.items[*].spec.replicas}")
		if err != nil || strings.TrimSpace(replicas) == "" {
			return false, nil
		}
		ctrls := 0
		ready := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[1] != "Running" || strings.Contains(line, "false") {
				continue
			}
			key := f[0]
			if strings.HasPrefix(key, "controller/") {
				key = "controller"
				ctrls++
			}
			ready[key] = true
		}
		if strconv.Itoa(ctrls) != strings.TrimSpace(replicas) {
			return false, nil
		}
		for k := range want {
			if !ready[k] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w; localdir pods (component/node phase ready):\n%s", err, last)
	}
	return nil
}

// Kubectl runs kubectl with the admin kubeconfig; stdin may be "".
func (c *Cluster) Kubectl(ctx context.Context, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.tool("kubectl"), append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func execOutput(ctx context.Context, argv ...string) (string, error) {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return string(out), nil
}

func run(ctx context.Context, argv ...string) error {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitFor polls cond every 100ms until it is true, fails, or timeout.
func (c *Cluster) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) httpClient() *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} // #nosec: readiness probes only
	if cert, err := tls.LoadX509KeyPair(c.path("pki", "admin.crt"), c.path("pki", "admin.key")); err == nil {
		tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Transport: tr, Timeout: 2 * time.Second}
}

func (c *Cluster) httpOK(url, want string) bool {
	resp, err := c.httpClient().Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b := make([]byte, 4096)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode == 200 && strings.Contains(string(b[:n]), want)
}

func (c *Cluster) waitHTTP(ctx context.Context, name, url, want string) error {
	return c.waitFor(ctx, name, 60*time.Second, func() (bool, error) {
		if !c.Running(name) {
			return false, fmt.Errorf("%s exited (see logs/%s.log)", name, name)
		}
		return c.httpOK(url, want), nil
	})
}

// state is what Down needs to know about the host before Up.
type state struct {
	Loops     []string `json:"loops"`
	HostPaths []string `json:"hostPaths"`
}

func (c *Cluster) recordBaseline() error {
	s := state{Loops: loopDevices()}
	for _, p := range hostPaths {
		if _, err := os.Lstat(p); err == nil {
			s.HostPaths = append(s.HostPaths, p)
		}
	}
	b, _ := json.Marshal(s)
	return os.WriteFile(c.path("baseline.json"), b, 0o644)
}
