// Package driver implements the CSI Identity, Controller and Node services:
// validation, capabilities, idempotency, locking and the mapping of errors
// to gRPC codes. It does no disk I/O: it works on a Node (nodeside.go) and,
// in controller mode, on a cluster Backend.
package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/keylock"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// version can be set with -ldflags "-X ...driver.version=v1.2.3"; without it
// the version comes from the Go build info (module version or VCS revision).
var version = ""

// Version is the driver version reported by GetPluginInfo, never empty.
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "devel-" + rev
}

// Driver is one localdir process: the services its mode serves, and in
// node and all mode the node's volumes and publisher.
type Driver struct {
	opts    Options
	store   Volumes      // the node's volumes (node, all mode)
	pub     Publisher    // the node side of the Node service (node, all mode)
	backend Backend      // what the Controller service works on (controller, all mode)
	names   *keylock.Set // Controller service: CreateVolume, CreateSnapshot by name
	ids     *keylock.Set // Controller service: the other calls by volume_id or snapshot_id
	version string

	server      *grpc.Server
	interceptor grpc.UnaryServerInterceptor // WithInterceptor's, or nil
}

// Option is what New is given besides the Options of the flags.
type Option func(*newConfig)

type newConfig struct {
	interceptor grpc.UnaryServerInterceptor
}

// WithInterceptor runs i on every call before the driver's own logging
// interceptor. Tests use it to rewrite what a CO sends (csi-sanity cannot
// set a capability's fs_type; the image-volume sanity runs add it).
func WithInterceptor(i grpc.UnaryServerInterceptor) Option {
	return func(c *newConfig) { c.interceptor = i }
}

// New returns a node- or all-mode driver over node (opened and recovered by
// pkg/app's OpenNode); in all mode the Controller service works on it too.
func New(opts Options, node Node, with ...Option) (*Driver, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Mode == ModeController {
		return nil, errors.New("--mode=controller needs a cluster backend: use NewController")
	}
	if node.Volumes == nil || node.Snapshots == nil || node.Publisher == nil {
		return nil, errors.New("driver.New: a node needs its volumes, snapshots and publisher")
	}
	var nc newConfig
	for _, o := range with {
		o(&nc)
	}
	d := &Driver{opts: opts, store: node.Volumes, pub: node.Publisher, names: keylock.New(), ids: keylock.New(), version: Version(), interceptor: nc.interceptor}
	if opts.Mode == ModeAll {
		d.backend = &LocalBackend{Volumes: node.Volumes, Snapshots: node.Snapshots, NodeID: opts.NodeID, MaxVolumeBytes: opts.MaxVolumeBytes}
	}
	return d, nil
}

// NewController returns a controller-mode driver whose Controller service
// works on backend (pkg/cluster's ControllerBackend).
func NewController(opts Options, backend Backend) (*Driver, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Mode != ModeController {
		return nil, fmt.Errorf("NewController: mode is %q", opts.Mode)
	}
	return &Driver{opts: opts, names: keylock.New(), ids: keylock.New(), version: Version(), backend: backend}, nil
}

// Run serves the CSI services on the endpoint until ctx is done, then stops
// gracefully and closes the state file.
func (d *Driver) Run(ctx context.Context) error {
	return errors.Join(d.Serve(ctx), d.Close())
}

// Serve is Run without closing the state file, for callers whose other users
// of the store (the node agent) stop later.
func (d *Driver) Serve(ctx context.Context) error {
	path, err := ParseEndpoint(d.opts.Endpoint)
	if err != nil {
		return err
	}
	lis, err := Listen(path)
	if err != nil {
		return err
	}
	chain := []grpc.UnaryServerInterceptor{logRPC}
	if d.interceptor != nil {
		chain = append([]grpc.UnaryServerInterceptor{d.interceptor}, chain...)
	}
	d.server = grpc.NewServer(grpc.ChainUnaryInterceptor(chain...), grpc.ChainStreamInterceptor(logStreamRPC))
	d.Register(d.server)
	klog.InfoS("Serving CSI", "driver", d.opts.DriverName, "version", d.version, "mode", d.opts.Mode,
		"endpoint", d.opts.Endpoint, "nodeID", d.opts.NodeID, "dataRoot", d.opts.DataRoot)
	errc := make(chan error, 1)
	go func() { errc <- d.server.Serve(lis) }()
	if d.pub != nil {
		go d.pub.RunIOLimits(ctx)
	}
	select {
	case <-ctx.Done():
		stopped := make(chan struct{})
		go func() { d.server.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			d.server.Stop()
		}
		err = nil
	case err = <-errc:
	}
	_ = os.Remove(path)
	return err
}

// Register adds the services of the driver's mode to s.
func (d *Driver) Register(s *grpc.Server) {
	csi.RegisterIdentityServer(s, &identity{d: d})
	if d.opts.Mode != ModeNode {
		csi.RegisterControllerServer(s, &controller{d: d})
	}
	if g, ok := d.groupBackend(); ok {
		csi.RegisterGroupControllerServer(s, &groupController{d: d, b: g})
	}
	if m, ok := d.metadataBackend(); ok {
		csi.RegisterSnapshotMetadataServer(s, &snapshotMetadata{d: d, b: m})
	}
	if d.opts.Mode != ModeController {
		csi.RegisterNodeServer(s, &node{d: d})
	}
}

// Close releases the data root.
func (d *Driver) Close() error {
	if d.store != nil {
		return d.store.Close()
	}
	return nil
}

// Listen opens a unix socket at path with mode 0660. A stale socket left by
// a killed process is replaced; a socket a live process answers on (another
// localdir on this --endpoint, which a takeover would cut off), or any other
// file there, is an error, never removed.
//
// The socket is bound in a private directory (mode 0700) beside path,
// chmod'ed and only then renamed to path: bind(2) applies the umask to 0777,
// so under umask 0 it would be connectable by anyone until the chmod.
func Listen(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket == 0 {
		return nil, fmt.Errorf("%s exists and is not a socket; refusing to replace it", path)
	} else if err == nil {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use: another process serves on it (is another localdir-csi running with this --endpoint?)", path)
		}
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".sock")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	if len(tmp) >= len(unix.RawSockaddrUnix{}.Path) {
		tmp = path // too long for a socket address: bind in place, as before
		_ = os.Remove(path)
	}
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false) // the socket moves to path; Run removes it there
	if err := os.Chmod(tmp, 0o660); err != nil {
		lis.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil && tmp != path { // replaces a stale socket
		lis.Close()
		return nil, err
	}
	return lis, nil
}

// quietRPCs are polled by the CO; their successes are logged at V(6) only.
var quietRPCs = map[string]bool{
	"/csi.v1.Identity/Probe":                       true,
	"/csi.v1.Identity/GetPluginInfo":               true,
	"/csi.v1.Node/NodeGetCapabilities":             true,
	"/csi.v1.Node/NodeGetVolumeStats":              true,
	"/csi.v1.Controller/ControllerGetCapabilities": true,
	"/csi.v1.Identity/GetPluginCapabilities":       true,
}

// logRPC logs requests at V(4) (secrets stripped), every failure with its
// gRPC code, and records the call in the localdir_rpc_* metrics.
func logRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	level := klog.Level(4)
	if quietRPCs[info.FullMethod] {
		level = 6
	}
	start := time.Now()
	if klog.V(level).Enabled() {
		klog.V(level).InfoS("GRPC call", "method", info.FullMethod, "request", protosanitizer.StripSecrets(req))
	}
	resp, err := handler(ctx, req)
	metrics.ObserveRPC(methodName(info.FullMethod), status.Code(err).String(), time.Since(start))
	if err != nil {
		st, _ := status.FromError(err)
		klog.ErrorS(nil, "GRPC failed", "method", info.FullMethod, "code", st.Code().String(), "message", st.Message(),
			"request", protosanitizer.StripSecrets(req), "duration", time.Since(start))
	} else if klog.V(level).Enabled() {
		klog.V(level).InfoS("GRPC done", "method", info.FullMethod, "response", protosanitizer.StripSecrets(resp), "duration", time.Since(start))
	}
	return resp, err
}

func methodName(full string) string { return full[strings.LastIndex(full, "/")+1:] }
