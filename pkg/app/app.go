// Package app wires a localdir process for its mode: the node's Store and
// Publisher (OpenNode), the CSI gRPC server, and in cluster modes the
// API-server side. cmd/localdir-csi only parses flags and handles signals.
package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/metrics"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// The API-server backend serves the CSI Controller service in controller
// mode (pkg/cluster implements pkg/driver's Backend without importing it).
var _ driver.Backend = (*cluster.ControllerBackend)(nil)

// RestConfig loads opts.Kubeconfig (empty: in-cluster) with the rate limits
// of --kube-api-qps and --kube-api-burst.
func RestConfig(opts driver.Options) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if opts.Kubeconfig == "" {
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not running in a cluster: %w", err)
		}
	} else if cfg, err = clientcmd.BuildConfigFromFlags("", opts.Kubeconfig); err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = opts.KubeAPIQPS, opts.KubeAPIBurst
	return cfg, nil
}

// Node is a node's storage and node side, as OpenNode opens them.
type Node struct {
	Store     *volume.Store
	Publisher *publish.Publisher
}

// OpenNode opens the node's data root in the order a start after a crash
// needs, each step logged: thaw what a killed process left frozen (before
// anything can fail), open the state file, recover. mounter nil: the real
// one. On failure nothing stays open.
func OpenNode(opts driver.Options, mounter mount.Interface) (*Node, error) {
	klog.InfoS("Thawing what a killed driver left frozen", "dataRoot", opts.DataRoot)
	publish.ThawFrozen(opts.DataRoot, opts.CgroupRoot)
	store, err := volume.Open(volume.Config{DataRoot: opts.DataRoot, CapacityBytes: opts.CapacityBytes, Engine: opts.Engine})
	if err != nil {
		return nil, err
	}
	pub, err := publish.New(store.NodeAccess(), publish.Config{Mounter: mounter, CgroupRoot: opts.CgroupRoot})
	if err != nil {
		return nil, errors.Join(err, store.Close())
	}
	klog.InfoS("Recovering the data root", "dataRoot", store.Root())
	if err := store.Recover(pub); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	if err := pub.LockUnused(); err != nil {
		klog.ErrorS(err, "Could not lock every unstaged encrypted directory volume")
	}
	klog.InfoS("Data root ready", "dataRoot", store.Root(), "engine", store.Engine(), "leftovers", len(store.Leftovers()))
	return &Node{Store: store, Publisher: pub}, nil
}

// NewDriver opens the node (OpenNode) and returns the node- or all-mode
// driver over it.
func NewDriver(opts driver.Options, mounter mount.Interface, with ...driver.Option) (*driver.Driver, *Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	n, err := OpenNode(opts, mounter)
	if err != nil {
		return nil, nil, err
	}
	d, err := driver.New(opts, driver.Node{Volumes: n.Store, Snapshots: n.Store.Snapshots(), Publisher: n.Publisher}, with...)
	if err != nil {
		return nil, nil, errors.Join(err, n.Store.Close())
	}
	return d, n, nil
}

// NodeMetrics reports the localdir_* gauges of one node's data root.
// orphans may be nil (all mode has no objects to claim data).
func NodeMetrics(n *Node, node string, orphans func() int64) metrics.StateFunc {
	vm := n.Store
	return func() []metrics.Sample {
		var out []metrics.Sample
		l := []string{node}
		if ci, err := vm.Capacity(); err == nil {
			out = append(out,
				metrics.Sample{Desc: metrics.CapacityDesc, Value: float64(ci.Total), Labels: l},
				metrics.Sample{Desc: metrics.AllocatableDesc, Value: float64(ci.Available), Labels: l},
				metrics.Sample{Desc: metrics.AllocatedDesc, Value: float64(ci.Allocated), Labels: l},
				metrics.Sample{Desc: metrics.FreeDesc, Value: float64(ci.Free), Labels: l})
		}
		if vols, _, err := vm.List("", 0); err == nil {
			out = append(out, metrics.Sample{Desc: metrics.VolumesDesc, Value: float64(len(vols)), Labels: []string{node, "Ready"}})
		}
		if snaps, _, err := vm.Snapshots().List("", 0, ""); err == nil {
			out = append(out, metrics.Sample{Desc: metrics.SnapshotsDesc, Value: float64(len(snaps)), Labels: []string{node, "Ready"}})
		}
		out = append(out, metrics.Sample{Desc: metrics.LoopDevicesDesc, Value: float64(n.Publisher.AttachedLoopDevices()), Labels: l})
		out = append(out, metrics.Sample{Desc: metrics.LeftoversDesc, Value: float64(len(vm.Leftovers())), Labels: l})
		if orphans != nil {
			out = append(out, metrics.Sample{Desc: metrics.OrphansDesc, Value: float64(orphans()), Labels: l})
		}
		return out
	}
}

// endpointDirExists checks, before anything is created, that the socket's
// directory exists: it is the CO's, not ours to make.
func endpointDirExists(endpoint string) error {
	p, err := driver.ParseEndpoint(endpoint)
	if err != nil {
		return err
	}
	dir := filepath.Dir(p)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			err = errors.New("not a directory")
		}
		return fmt.Errorf("--endpoint=%q: the socket's directory %s: %w (create it first)", endpoint, dir, err)
	}
	return nil
}

// Run runs the process for opts.Mode until ctx is done.
func Run(ctx context.Context, opts driver.Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	if err := endpointDirExists(opts.Endpoint); err != nil {
		return err
	}
	// The API server of the cluster modes; all mode has none.
	var cfg *rest.Config
	if opts.Mode != driver.ModeAll {
		var err error
		if cfg, err = RestConfig(opts); err != nil {
			return err
		}
	}
	ms, err := NewMetricsServer(opts, cfg)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	switch opts.Mode {
	case driver.ModeAll:
		d, n, err := NewDriver(opts, nil)
		if err != nil {
			return err
		}
		if err := serveMetrics(gctx, g, ms, NodeMetrics(n, opts.NodeID, nil)); err != nil {
			return err
		}
		g.Go(func() error { return d.Run(gctx) })
		return g.Wait()
	case driver.ModeController:
		b, err := cluster.NewControllerBackend(gctx, cfg, opts.MaxVolumeBytes)
		if err != nil {
			return err
		}
		b.StaleAfter = opts.NodeStaleAfter
		host, _ := os.Hostname() // the pod's name: one certificate per replica
		ranges, err := ServeControllerRanges(gctx, opts, cfg, b, host)
		if err != nil {
			return err
		}
		if ranges != nil {
			g.Go(ranges)
		}
		sms, err := PublishSnapshotMetadata(opts, cfg)
		if err != nil {
			return err
		}
		if sms != nil {
			g.Go(func() error { sms(gctx); return nil })
		}
		if _, err := b.StartMover(gctx, cfg, opts.DriverName, moverLease()); err != nil {
			return err
		}
		d, err := driver.NewController(opts, b)
		if err != nil {
			return err
		}
		if err := serveMetrics(gctx, g, ms, func() []metrics.Sample { return b.MetricSamples(gctx) }); err != nil {
			return err
		}
		g.Go(func() error { return d.Run(gctx) })
		return g.Wait()
	}
	d, n, err := NewDriver(opts, nil)
	if err != nil {
		return err
	}
	xfer, err := NewTransfer(opts, cfg, n.Store)
	if err != nil {
		return errors.Join(err, d.Close())
	}
	agent := &cluster.NodeAgent{NodeID: opts.NodeID, Store: n.Store, Snapshots: n.Store.Snapshots(), Version: driver.Version(), MaxVolumeBytes: opts.MaxVolumeBytes,
		Heartbeat: opts.HeartbeatInterval}
	if xfer != nil {
		agent.Transfer = xfer.Agent
		g.Go(func() error { return xfer.Serve(gctx) })
	}
	if err := serveMetrics(gctx, g, ms, NodeMetrics(n, opts.NodeID, agent.Orphans)); err != nil {
		return err
	}
	g.Go(func() error { return agent.Start(gctx, cfg) })
	// The gRPC server stops when the agent fails, and the other way round;
	// the state file is closed once both stopped using it.
	g.Go(func() error { return d.Serve(gctx) })
	return errors.Join(g.Wait(), d.Close())
}

// moverLease is the Lease the controller replicas elect their volume mover
// with: in the pod's namespace (its ServiceAccount's), held under the pod's
// name; nil outside a pod (one controller, no election).
func moverLease() *cluster.MoverLease {
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	host, herr := os.Hostname()
	if err != nil || herr != nil || len(ns) == 0 {
		return nil
	}
	return &cluster.MoverLease{Namespace: strings.TrimSpace(string(ns)), Identity: host}
}
