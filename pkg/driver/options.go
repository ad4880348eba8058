package driver

import (
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Mode is which CSI services one process serves (--mode).
type Mode string

// The modes.
const (
	ModeController Mode = "controller"
	ModeNode       Mode = "node"
	ModeAll        Mode = "all"
)

// DefaultDriverName is the CSI driver name (CSIDriver object, StorageClass
// provisioner) unless --driver-name says otherwise.
const DefaultDriverName = "localdir.csi.dev"

// DefaultKubeletRoot is --kubelet-root in node mode unless the flag is given.
const DefaultKubeletRoot = "/var/lib/kubelet"

// TopologyKey is the accessible_topology segment key that pins a volume to
// its node (contract.TopologyKey). Its value is the node id.
const TopologyKey = contract.TopologyKey

// Options are the validated settings of one driver process. cmd/localdir-csi
// fills them from flags (AddFlags) and calls Validate.
type Options struct {
	// Mode is ModeController, ModeNode or ModeAll.
	Mode Mode
	// Endpoint is the gRPC listen address, unix:///path/to/csi.sock.
	Endpoint string
	// DriverName is the CSI plugin name (GetPluginInfo.name).
	DriverName string
	// NodeID identifies this node (NodeGetInfo.node_id and topology value).
	NodeID string
	// DataRoot is the directory under which volumes and state live.
	DataRoot string
	// CapacityBytes caps what all volumes may reserve; 0: the data root's size.
	CapacityBytes int64
	// MaxVolumeBytes is the largest volume a CreateVolume may ask for; 0: none.
	MaxVolumeBytes int64
	// DefaultVolumeBytes is the size of a new empty volume asked for without
	// required_bytes; a restore or clone gets its source's size.
	DefaultVolumeBytes int64
	// MaxVolumesPerNode is NodeGetInfo.max_volumes_per_node (0 = unlimited).
	MaxVolumesPerNode int64
	// Engine is the storage engine for new mount volumes: auto, dir or btrfs.
	Engine contract.Engine
	// MetricsAddress is where /metrics is served (empty: nowhere): HTTPS behind
	// the API server's authentication and authorization in controller and node
	// mode, plain HTTP on loopback in all mode (validateMetrics).
	MetricsAddress string
	// MetricsCertDir holds tls.crt and tls.key for the HTTPS /metrics server,
	// reloaded when they change; empty: a self-signed certificate.
	MetricsCertDir string
	// Kubeconfig is the kubeconfig file; empty: the in-cluster configuration.
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst are the API client's rest.Config QPS and
	// Burst. Their defaults are high: client-go's own (5, 10) held 100 PVCs
	// back by seconds.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// HeartbeatInterval is how often the node agent writes its LocalNode
	// status; NodeStaleAfter is how old that status may get before the
	// controller treats the node as gone (no capacity, no placement).
	HeartbeatInterval time.Duration
	NodeStaleAfter    time.Duration
	// TransferAddress is where node mode serves the node-to-node data
	// channel (host:port; empty: none, and no volume is made from another
	// node's data here); TransferAdvertise the host:port its peers dial,
	// published in LocalNode status; TransferCertLifetime how long each
	// key's certificate is valid (renewed at half of it).
	TransferAddress      string
	TransferAdvertise    string
	TransferCertLifetime time.Duration
	// Namespace is the driver's namespace, where the controller publishes
	// its certificate for the node-to-node channel (changed block
	// tracking); empty: the pod's ServiceAccount namespace, and outside a
	// pod none (the SnapshotMetadata service is then not served).
	Namespace string
	// SnapshotMetadataAddress, when set, is the host:port of the
	// external-snapshot-metadata sidecar's Service: the controller keeps
	// the SnapshotMetadataService named after the driver pointing at it,
	// with SnapshotMetadataAudience (default: the driver name), and the
	// Secret SnapshotMetadataSecret in Namespace holding
	// the sidecar's certificate for that host.
	SnapshotMetadataAddress  string
	SnapshotMetadataSecret   string
	SnapshotMetadataAudience string
	SnapshotMetadataCertDir  string // where the sidecar reads tls.crt, tls.key
	// KubeletRoot, when set, confines staging and target paths below it
	// (checkKubeletRoot). ApplyModeDefaults sets it in node mode.
	KubeletRoot string
	// CgroupRoot is where the cgroup hierarchy is mounted, for image volumes'
	// I/O limits and group snapshots' freezes; empty: neither.
	CgroupRoot string

	capacity, maxVolume, defaultVolume quantityFlag
}

// quantityFlag parses a size in bytes given as a plain number or a
// Kubernetes quantity ("10Gi", "500M").
type quantityFlag struct{ v *int64 }

func (q quantityFlag) String() string {
	if q.v == nil || *q.v == 0 {
		return "0"
	}
	return resource.NewQuantity(*q.v, resource.BinarySI).String()
}

// Type names the flag's value in --help (pflag.Value).
func (q quantityFlag) Type() string { return "quantity" }

func (q quantityFlag) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*q.v = n
	return nil
}

// ParseBytes parses a size in bytes: a plain integer or a Kubernetes quantity
// ("100Mi", "1G"); fractions round up. Errors on negative values and the rest.
func ParseBytes(s string) (int64, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a size in bytes (examples: 1073741824, 1Gi, 500Mi)", s)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("size %q is negative", s)
	}
	// Quantity.Value wraps or clamps what does not fit in an int64.
	if q.Cmp(*resource.NewQuantity(math.MaxInt64, resource.DecimalSI)) > 0 {
		return 0, fmt.Errorf("size %q is too large (at most %d bytes)", s, int64(math.MaxInt64))
	}
	n, ok := q.AsInt64()
	if !ok {
		n = q.Value() // rounds up fractions
	}
	return n, nil
}

// Flag sections, in --help order: the modes each flag applies to.
const (
	FlagsAllModes   = "All modes"
	FlagsController = "Controller service (controller and all mode)"
	FlagsCluster    = "Cluster modes (controller and node)"
	FlagsNode       = "Node service and data root (node and all mode)"
)

// AddFlags registers the driver's flags on fs and returns them grouped in the
// sections above (NamedFlagSets, for --help).
func (o *Options) AddFlags(fs *pflag.FlagSet) *cliflag.NamedFlagSets {
	host, _ := os.Hostname()
	o.DefaultVolumeBytes = 1 << 30
	o.capacity = quantityFlag{&o.CapacityBytes}
	o.maxVolume = quantityFlag{&o.MaxVolumeBytes}
	o.defaultVolume = quantityFlag{&o.DefaultVolumeBytes}
	fss := &cliflag.NamedFlagSets{}
	all := fss.FlagSet(FlagsAllModes)
	all.StringVar((*string)(&o.Mode), "mode", string(ModeAll), "which CSI services to serve: controller (Identity+Controller, in the cluster Deployment), node (Identity+Node, in the DaemonSet) or all (every service in one process, no Kubernetes)")
	all.StringVar(&o.Endpoint, "endpoint", "unix:///csi/csi.sock", "gRPC endpoint to listen on, unix:///path/to/csi.sock (the socket is created with mode 0660)")
	all.StringVar(&o.DriverName, "driver-name", DefaultDriverName, "CSI driver name, as in the StorageClass provisioner field")
	all.StringVar(&o.MetricsAddress, "metrics-address", "", "host:port to serve Prometheus metrics on at /metrics (default: off). Controller and node mode: HTTPS, only to a bearer token the API server authenticates and allows get on /metrics (e.g. :9810); all mode: plain HTTP with no authentication, so on a loopback address only (e.g. 127.0.0.1:9810)")
	ctl := fss.FlagSet(FlagsController)
	ctl.Var(o.maxVolume, "max-volume-size", "largest volume a CreateVolume may request, in bytes or e.g. 10Gi (default 0: no limit but the capacity)")
	ctl.Var(o.defaultVolume, "default-volume-size", "size of a new empty volume requested without capacity_range.required_bytes (a restore or clone gets its source's size), in bytes or e.g. 1Gi")
	cl := fss.FlagSet(FlagsCluster)
	cl.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file for the API server (default: in-cluster configuration)")
	cl.Float32Var(&o.KubeAPIQPS, "kube-api-qps", 200, "requests per second to the API server the controller or node agent may sustain")
	cl.IntVar(&o.KubeAPIBurst, "kube-api-burst", 400, "requests the controller or node agent may send to the API server at once, above --kube-api-qps")
	cl.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 30*time.Second, "node mode: how often the node agent writes its LocalNode status (capacity, free space, heartbeat)")
	cl.DurationVar(&o.NodeStaleAfter, "node-stale-after", 3*time.Minute, "controller mode: how old a LocalNode heartbeat may be before the node counts as gone (no capacity reported, no volume placed there); keep it several --heartbeat-interval")
	cl.StringVar(&o.TransferAddress, "transfer-address", "", "node mode: host:port to serve the node-to-node data channel on (mutual TLS with keys pinned in LocalNode status; e.g. :9811). Default: off, and restores and clones from another node's data are refused here")
	cl.StringVar(&o.TransferAdvertise, "transfer-advertise-address", "", "node mode: host:port the other node plugins dial to reach --transfer-address (e.g. $(POD_IP):9811); default: --transfer-address when it names a host")
	cl.DurationVar(&o.TransferCertLifetime, "transfer-cert-lifetime", 24*time.Hour, "validity of the node-to-node channel's certificates (a node plugin's, and the controller's for changed block tracking); a new key is made at start and at half this")
	cl.StringVar(&o.Namespace, "namespace", "", "the driver's namespace, where the controller publishes its channel certificate in the ConfigMap localdir-controller-certificates (default: the pod's ServiceAccount namespace)")
	cl.StringVar(&o.SnapshotMetadataAddress, "snapshot-metadata-address", "", "controller mode: host:port of the external-snapshot-metadata sidecar's Service (e.g. localdir-snapshot-metadata.localdir:6443); the controller then keeps the SnapshotMetadataService named after the driver pointing at it and the sidecar's TLS certificate in --snapshot-metadata-secret (default: off, neither is written)")
	cl.StringVar(&o.SnapshotMetadataSecret, "snapshot-metadata-secret", "localdir-snapshot-metadata-tls", "controller mode: the Secret in --namespace that holds the sidecar's certificate (tls.crt, tls.key), renewed by the controller (it must exist: deploy/ ships it empty)")
	cl.StringVar(&o.SnapshotMetadataAudience, "snapshot-metadata-audience", "", "controller mode: the audience backup tools' tokens must carry, published in the SnapshotMetadataService (default: the driver name)")
	cl.StringVar(&o.SnapshotMetadataCertDir, "snapshot-metadata-cert-dir", "", "controller mode: a directory shared with the sidecar (an emptyDir) where the controller writes the Secret's tls.crt and tls.key whenever they change (default: none; the sidecar then mounts the Secret itself)")
	cl.StringVar(&o.MetricsCertDir, "metrics-cert-dir", "", "directory holding tls.crt and tls.key (a kubernetes.io/tls Secret, e.g. cert-manager's) for the HTTPS /metrics server, reloaded when they change (default: a self-signed certificate made at start)")
	node := fss.FlagSet(FlagsNode)
	node.StringVar(&o.NodeID, "node-id", host, "this node's id, also the value of the "+TopologyKey+" topology key")
	node.StringVar(&o.DataRoot, "data-root", "/var/lib/localdir", "absolute directory holding the volumes and the state file")
	node.Var(o.capacity, "capacity", "bytes all volumes together may reserve, e.g. 100Gi (default 0: the size of the data root's filesystem)")
	node.StringVar((*string)(&o.Engine), "engine", string(contract.EngineAuto), "storage engine for mount volumes: auto (btrfs when the data root is on btrfs, else dir), dir (plain directories, capacity tracked) or btrfs (subvolumes, capacity enforced by qgroups)")
	node.StringVar(&o.KubeletRoot, "kubelet-root", "", "the kubelet's root directory: staging and target paths not below it (symlinks resolved) are refused with INVALID_ARGUMENT (default "+DefaultKubeletRoot+" in node mode, no check in all mode; --kubelet-root= turns the check off)")
	node.StringVar(&o.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", "where the node's cgroup hierarchy (v1 or v2) is mounted: the I/O limits of image volumes and the pod freezes of group snapshots act on the cgroups of the pods that use volumes (--cgroup-root= turns both off)")
	node.Int64Var(&o.MaxVolumesPerNode, "max-volumes-per-node", 0, "NodeGetInfo max_volumes_per_node, a count (default 0: unlimited)")
	for _, name := range fss.Order {
		fs.AddFlagSet(fss.FlagSet(name))
	}
	return fss
}

// ApplyModeDefaults sets, after fs.Parse, the defaults that depend on --mode
// for the flags fs did not set: --kubelet-root in node mode.
func (o *Options) ApplyModeDefaults(fs *pflag.FlagSet) {
	if !fs.Changed("kubelet-root") && o.Mode == ModeNode {
		o.KubeletRoot = DefaultKubeletRoot
	}
}

// nodeIDPattern is a Kubernetes label value: node ids become topology
// label values on the Node object.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)

// Validate checks the options and returns the first problem found.
func (o *Options) Validate() error {
	switch o.Mode {
	case ModeAll, ModeNode, ModeController:
	default:
		return fmt.Errorf("--mode=%q: must be controller, node or all", o.Mode)
	}
	if _, err := ParseEndpoint(o.Endpoint); err != nil {
		return err
	}
	if o.DriverName == "" || len(o.DriverName) > 63 {
		return fmt.Errorf("--driver-name=%q: must be 1 to 63 characters", o.DriverName)
	}
	if o.Mode != ModeController {
		if !nodeIDPattern.MatchString(o.NodeID) {
			return fmt.Errorf("--node-id=%q: must be a valid Kubernetes label value (1-63 characters [A-Za-z0-9-_.], alphanumeric at both ends)", o.NodeID)
		}
		if !filepath.IsAbs(o.DataRoot) {
			return fmt.Errorf("--data-root=%q: must be an absolute path", o.DataRoot)
		}
		if filepath.Clean(o.DataRoot) == "/" {
			return fmt.Errorf("--data-root=%q: must be a directory of its own, not the root of the host (localdir creates volumes/, snapshots/, block/, orphaned/ and state.db in it)", o.DataRoot)
		}
		if o.CgroupRoot != "" && !filepath.IsAbs(o.CgroupRoot) {
			return fmt.Errorf("--cgroup-root=%q: must be an absolute path (or empty for none)", o.CgroupRoot)
		}
		if o.KubeletRoot != "" && !filepath.IsAbs(o.KubeletRoot) {
			return fmt.Errorf("--kubelet-root=%q: must be an absolute path (or empty for no check)", o.KubeletRoot)
		}
	}
	switch o.Engine {
	case "auto", "dir", "btrfs":
	default:
		return fmt.Errorf("--engine=%q: must be auto, dir or btrfs", o.Engine)
	}
	if o.Mode != ModeAll && (o.KubeAPIQPS <= 0 || o.KubeAPIBurst < 1) {
		return fmt.Errorf("--kube-api-qps=%g, --kube-api-burst=%d: both must be positive", o.KubeAPIQPS, o.KubeAPIBurst)
	}
	if o.Mode != ModeAll && (o.HeartbeatInterval < time.Second || o.NodeStaleAfter < time.Second) {
		return fmt.Errorf("--heartbeat-interval=%s, --node-stale-after=%s: both must be at least 1s", o.HeartbeatInterval, o.NodeStaleAfter)
	}
	if err := o.validateMetrics(); err != nil {
		return err
	}
	if err := o.validateTransfer(); err != nil {
		return err
	}
	if err := o.validateSnapshotMetadata(); err != nil {
		return err
	}
	if o.CapacityBytes < 0 || o.MaxVolumeBytes < 0 || o.DefaultVolumeBytes <= 0 || o.MaxVolumesPerNode < 0 {
		return fmt.Errorf("sizes and counts must not be negative, --default-volume-size must be positive")
	}
	return nil
}

// TransferPeerAddress is the address the other node plugins dial:
// --transfer-advertise-address, else --transfer-address.
func (o *Options) TransferPeerAddress() string {
	if o.TransferAdvertise != "" {
		return o.TransferAdvertise
	}
	return o.TransferAddress
}

// validateTransfer checks the node-to-node channel's flags.
func (o *Options) validateTransfer() error {
	if o.TransferAddress == "" {
		if o.TransferAdvertise != "" {
			return fmt.Errorf("--transfer-advertise-address=%q: set --transfer-address too", o.TransferAdvertise)
		}
		return nil
	}
	if o.Mode != ModeNode {
		return fmt.Errorf("--transfer-address=%q: only node mode serves the node-to-node channel", o.TransferAddress)
	}
	host, _, err := net.SplitHostPort(o.TransferAddress)
	if err != nil {
		return fmt.Errorf("--transfer-address=%q: must be host:port, e.g. :9811", o.TransferAddress)
	}
	if o.TransferAdvertise == "" && host == "" {
		return fmt.Errorf("--transfer-address=%q names no host: set --transfer-advertise-address (e.g. $(POD_IP):9811)", o.TransferAddress)
	}
	if h, p, err := net.SplitHostPort(o.TransferPeerAddress()); err != nil || h == "" || p == "" {
		return fmt.Errorf("--transfer-advertise-address=%q: must be host:port with a host the other nodes reach", o.TransferAdvertise)
	}
	if o.TransferCertLifetime < 10*time.Minute {
		return fmt.Errorf("--transfer-cert-lifetime=%s: at least 10m", o.TransferCertLifetime)
	}
	return nil
}

// validateSnapshotMetadata checks --snapshot-metadata-address: a host the
// sidecar's certificate can name, and a port.
func (o *Options) validateSnapshotMetadata() error {
	if o.SnapshotMetadataAddress == "" {
		return nil
	}
	h, p, err := net.SplitHostPort(o.SnapshotMetadataAddress)
	if err != nil || h == "" || p == "" {
		return fmt.Errorf("--snapshot-metadata-address=%q: must be host:port, e.g. localdir-snapshot-metadata.localdir:6443", o.SnapshotMetadataAddress)
	}
	if o.SnapshotMetadataSecret == "" {
		return fmt.Errorf("--snapshot-metadata-secret is empty: name the Secret that holds the sidecar's certificate")
	}
	return nil
}

// validateMetrics checks the metrics flags. All mode has no API server to
// check a token with, so it serves plain HTTP, on loopback only.
func (o *Options) validateMetrics() error {
	if o.MetricsAddress != "" {
		host, port, err := net.SplitHostPort(o.MetricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-address=%q: must be host:port, e.g. :9810 or 127.0.0.1:9810", o.MetricsAddress)
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return fmt.Errorf("--metrics-address=%q: the port must be a number from 1 to 65535", o.MetricsAddress)
		}
		if o.Mode == ModeAll && !isLoopback(host) {
			return fmt.Errorf("--metrics-address=%q: all mode serves /metrics over plain HTTP without authentication, so only on a loopback address (127.0.0.1:%s, [::1]:%s or localhost:%s); controller and node mode serve it over HTTPS to tokens the API server allows", o.MetricsAddress, port, port, port)
		}
	}
	if o.MetricsCertDir != "" {
		switch {
		case o.Mode == ModeAll:
			return fmt.Errorf("--metrics-cert-dir=%q: all mode serves /metrics over plain HTTP on loopback; the certificate is for controller and node mode", o.MetricsCertDir)
		case o.MetricsAddress == "":
			return fmt.Errorf("--metrics-cert-dir=%q: set --metrics-address too, or no metrics are served", o.MetricsCertDir)
		case !filepath.IsAbs(o.MetricsCertDir):
			return fmt.Errorf("--metrics-cert-dir=%q: must be an absolute path", o.MetricsCertDir)
		}
	}
	return nil
}

// isLoopback tells whether host names only this host's loopback interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// ParseEndpoint returns the socket path of a unix:// endpoint.
func ParseEndpoint(ep string) (string, error) {
	p, ok := strings.CutPrefix(ep, "unix://")
	if !ok || !filepath.IsAbs(p) {
		return "", fmt.Errorf("--endpoint=%q: must be unix:///absolute/path.sock", ep)
	}
	return p, nil
}
