// Package testdriver starts a localdir driver in-process for tests, on
// t.TempDir() sockets and data roots, and checks afterwards that nothing it
// mounted is left in the mount table. It also builds, starts and kills the
// driver binary as a child process (proc.go).
package testdriver

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/mount"
)

// Instance is a running driver and a client connection to it.
type Instance struct {
	Opts     driver.Options
	Dir      string // temp dir holding the socket, the data root and the test's paths
	Endpoint string
	Conn     *grpc.ClientConn

	Identity   csi.IdentityClient
	Controller csi.ControllerClient
	Node       csi.NodeClient

	cancel context.CancelFunc
	done   chan error
}

// RequireRoot fails (never skips) the test when not run as root: the tests
// use real bind mounts and a skip would hide a missing feature.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes real mounts and must run as root (sudo make test)")
	}
}

// DefaultOptions returns the driver's flag defaults for all mode on dir.
func DefaultOptions(dir string) driver.Options {
	var o driver.Options
	o.AddFlags(pflag.NewFlagSet("test", pflag.PanicOnError))
	o.Mode = driver.ModeAll
	o.NodeID = "test-node"
	o.DataRoot = filepath.Join(dir, "data")
	o.Endpoint = "unix://" + filepath.Join(dir, "csi.sock")
	return o
}

// Start runs a driver in all mode in a fresh temp dir. mutate may change
// the options first. The driver is stopped, and the mount table checked for
// leftovers under the temp dir, when the test ends.
func Start(t testing.TB, mutate func(*driver.Options)) *Instance {
	t.Helper()
	RequireRoot(t)
	dir := TempDir(t)
	o := DefaultOptions(dir)
	if mutate != nil {
		mutate(&o)
	}
	in := StartWith(t, o)
	in.Dir = dir
	return in
}

// TempDir is t.TempDir() plus a check, at cleanup, that no mount is left
// under it (cleanups run last-in first-out, so this check runs after every
// cleanup registered later, driver stop included).
func TempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { AssertNoMounts(t, dir) })
	return dir
}

// StartWith runs a driver with exactly these options (and New's options
// with) until the test ends.
func StartWith(t testing.TB, o driver.Options, with ...driver.Option) *Instance {
	t.Helper()
	return StartWithMounter(t, o, nil, with...)
}

// StartWithMounter is StartWith with the node's mounts made by m (a
// mount.Fake for a run without root; nil: the real mounter).
func StartWithMounter(t testing.TB, o driver.Options, m mount.Interface, with ...driver.Option) *Instance {
	t.Helper()
	d, _, err := app.NewDriver(o, m, with...)
	if err != nil {
		t.Fatalf("start driver: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &Instance{Opts: o, Endpoint: o.Endpoint, cancel: cancel, done: make(chan error, 1)}
	go func() { in.done <- d.Run(ctx) }()
	sock := strings.TrimPrefix(o.Endpoint, "unix://")
	deadline := time.Now().Add(10 * time.Second)
	// The socket file appears at bind(2), a moment before listen(2); a
	// dial in between is refused and fails the first RPC. Wait until a
	// connection is accepted, not merely for the file.
	for {
		if c, err := net.DialTimeout("unix", sock, time.Second); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver socket %s did not accept connections", sock)
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn, err := grpc.NewClient(o.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	in.Conn = conn
	in.Identity, in.Controller, in.Node = csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	t.Cleanup(func() { in.Stop(t) })
	return in
}

// Stop stops the driver (gracefully) and closes the client; safe to repeat.
func (in *Instance) Stop(t testing.TB) {
	if in.cancel == nil {
		return
	}
	in.cancel()
	in.cancel = nil
	_ = in.Conn.Close()
	if err := <-in.done; err != nil {
		t.Errorf("driver stopped with error: %v", err)
	}
}

// AssertNoMounts fails the test when anything is mounted at or under dir,
// and unmounts it so one failure does not leak into the next test.
func AssertNoMounts(t testing.TB, dir string) {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir
	}
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(real))
	if err != nil {
		t.Errorf("read mount table: %v", err)
		return
	}
	for i := len(ms) - 1; i >= 0; i-- {
		t.Errorf("left mounted after the test: %s", ms[i].Mountpoint)
	}
	for i := len(ms) - 1; i >= 0; i-- {
		_ = unmount(ms[i].Mountpoint)
	}
}
