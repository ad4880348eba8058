package bench

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// hostPathIDs are csi-driver-host-path's volume_ids (UUIDs).
var hostPathIDs = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// BenchmarkPairsVsHostPath runs CreateVolume+DeleteVolume pairs on
// localdir and, in the same sitting, on csi-driver-host-path (its
// hostpathplugin binary, state directory on the machine's disk), in
// alternating halves (host-path, localdir, localdir, host-path) so that a
// drift in the machine's load weighs on both: one at a time and 16 at
// once, with localdir's data root on the machine's disk (dir engine) and
// on a loop-backed btrfs (btrfs engine); and both ways with both
// drivers' state on one tmpfs, where a flush costs nothing: what each
// driver costs besides the disk's flushes, which host-path never asks
// for. Figures: pairs/s of each and their ratio (x-host-path), the create
// and delete p50 of each.
//
// host-path is not part of this repository: build it from its source (the
// tag the figures name) into _output/peers/hostpathplugin, or name the
// binary in HOSTPATH_PLUGIN; without it the benchmark is skipped, saying
// so. host-path keeps its state in a JSON file it rewrites on every change
// without syncing it; localdir commits each create and delete durably
// (bbolt, fdatasync) before answering.
func BenchmarkPairsVsHostPath(b *testing.B) {
	bin, err := hostPathBinary()
	if err != nil {
		b.Skip(err)
	}
	for _, c := range []struct {
		name, fs, engine string
		conc             int
	}{
		{"disk-sequential", "", "dir", 1},
		{"disk-concurrent16", "", "dir", 16},
		{"btrfs-sequential", testfs.Btrfs, "btrfs", 1},
		{"btrfs-concurrent16", testfs.Btrfs, "btrfs", 16},
		{"tmpfs-sequential", testfs.Tmpfs, "dir", 1},
		{"tmpfs-concurrent16", testfs.Tmpfs, "dir", 16},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.StopTimer()
			in := startDriverOn(b, c.fs, c.engine)
			stateDir := ""
			if c.fs == testfs.Tmpfs {
				stateDir = filepath.Join(filepath.Dir(in.Opts.DataRoot), "host-path")
			}
			hp := startHostPath(b, bin, stateDir)
			clients := map[bool]csi.ControllerClient{false: hp, true: in.Controller}
			ids := map[bool]*regexp.Regexp{false: hostPathIDs, true: volumeIDPattern}
			for _, ld := range []bool{false, true} {
				if _, err := runPairsOf(clients[ld], ids[ld], "warmup", warmupPairs, c.conc); err != nil {
					b.Fatal(err)
				}
			}
			totals := map[bool]*pairStats{false: {}, true: {}}
			half := pairsPerRun / 2
			for n := range b.N {
				for i, ld := range []bool{false, true, true, false} {
					if ld {
						b.StartTimer()
					}
					s, err := runPairsOf(clients[ld], ids[ld], fmt.Sprintf("pair-%d-%d", n, i), half, c.conc)
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					totals[ld].add(s)
				}
			}
			expectVolumes(b, in.Controller, 0, nil)
			ld, peer := totals[true], totals[false]
			reportPairs(b, ld)
			b.ReportMetric(peer.rate(), "host-path-pairs/s")
			b.ReportMetric(percentile(peer.create, 50), "host-path-create-p50-ms")
			b.ReportMetric(percentile(peer.delete, 50), "host-path-delete-p50-ms")
			b.ReportMetric(ld.rate()/peer.rate(), "x-host-path")
			fmt.Printf("PAIRS %-20s localdir %6.0f pairs/s (create p50 %.2f ms, delete p50 %.2f ms)  host-path %6.0f pairs/s (%.2f, %.2f ms)  %.2fx\n",
				c.name, ld.rate(), percentile(ld.create, 50), percentile(ld.delete, 50),
				peer.rate(), percentile(peer.create, 50), percentile(peer.delete, 50), ld.rate()/peer.rate())
		})
	}
}

// startDriverOn is startDriver with the data root on the machine's disk
// (fs "") or on a fresh loop-backed filesystem of kind fs whose loop device
// does direct I/O (so that it behaves as a disk, not as the page cache),
// with engine.
func startDriverOn(b *testing.B, fs, engine string) *testdriver.Instance {
	b.Helper()
	return startDriverSized(b, fs, engine, snapFSSize)
}

// startDriverSized is startDriverOn with a data root of size bytes.
func startDriverSized(b *testing.B, fs, engine string, size int64) *testdriver.Instance {
	b.Helper()
	if fs == "" {
		return startDriver(b)
	}
	root := testfs.NewDirect(b, fs, size)
	return testdriver.Start(b, func(o *driver.Options) {
		o.Engine = contract.Engine(engine)
		o.DataRoot = filepath.Join(root, "data")
		o.CapacityBytes = 1 << 40
	})
}

// startHostPath runs csi-driver-host-path's plugin with its state in
// stateDir ("": a fresh temp dir) and returns its controller client.
func startHostPath(b *testing.B, bin, stateDir string) csi.ControllerClient {
	b.Helper()
	hp := launchHostPath(b, bin, stateDir)
	return csi.NewControllerClient(hp.conn)
}

// hostPath is a running csi-driver-host-path plugin.
type hostPath struct {
	conn     *grpc.ClientConn
	proc     *testdriver.Proc
	stateDir string // where it keeps its volumes and snapshots
}

// launchHostPath runs csi-driver-host-path's plugin, with extra flags, its
// state in stateDir ("": in a fresh temp dir), and waits until it answers.
func launchHostPath(b *testing.B, bin, stateDir string, extra ...string) *hostPath {
	b.Helper()
	dir := testdriver.TempDir(b)
	ep := "unix://" + filepath.Join(dir, "csi.sock")
	hp := &hostPath{stateDir: cmp.Or(stateDir, filepath.Join(dir, "state"))}
	hp.proc = testdriver.Launch(b, bin, append([]string{"--endpoint=" + ep, "--nodeid=bench", "--statedir=" + hp.stateDir}, extra...))
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	hp.conn = conn
	// host-path's Probe leaves ready unset (ready, as the spec reads it):
	// the first answer is enough.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := call()
		_, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("csi-driver-host-path not serving after 30 s: %v", err)
		}
	}
	return hp
}

// hostPathBinary is the csi-driver-host-path plugin to compare with
// (HOSTPATH_PLUGIN, else _output/peers/hostpathplugin), or "" and why not.
func hostPathBinary() (string, error) {
	bin := os.Getenv("HOSTPATH_PLUGIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "_output", "peers", "hostpathplugin")
	}
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("no csi-driver-host-path binary at %s (build it from its source: go build ./cmd/hostpathplugin; or set HOSTPATH_PLUGIN): %w", bin, err)
	}
	return bin, nil
}
