// Package scale measures one node holding thousands of volumes in cluster
// mode (make bench-cluster): a real etcd and kube-apiserver, the driver
// binary in controller and in node mode as their ServiceAccounts, and
// LOCALDIR_SCALE_VOLUMES (default 5,000) volumes made through the
// controller's CreateVolume. It reports CreateVolume latency at 0 and at N
// existing volumes, the create and delete rates, each process's resident
// memory, and how long a SIGKILLed node plugin takes until it serves again,
// has written a fresh LocalNode heartbeat and carries out a new volume
// queued behind its N existing ones. BenchmarkAPIWrites prices each kind
// of write on a LocalVolume in kube-apiserver CPU. Figures:
// docs/benchmarks.md.
package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

var bin = testdriver.Binary{TempPattern: "localdir-scale-bin-"}

func TestMain(m *testing.M) {
	code := m.Run()
	bin.Remove()
	os.Exit(code)
}

const scaleNode = "scale-node"

func BenchmarkNodeScale(b *testing.B) {
	n := envCount(b, "LOCALDIR_SCALE_VOLUMES", 5000)
	for range b.N {
		nodeScale(b, n)
	}
}

func nodeScale(b *testing.B, n int) {
	env := clustertest.Start(b)
	ctrlID, nodeID := env.ControllerIdentity(b), env.NodeIdentity(b, scaleNode)
	dir := testdriver.TempDir(b)
	ctrlEP, nodeEP := "unix://"+filepath.Join(dir, "controller.sock"), "unix://"+filepath.Join(dir, "node.sock")
	nodeArgs := []string{"--mode=node", "--endpoint=" + nodeEP, "--kubeconfig=" + nodeID.Kubeconfig,
		"--data-root=" + filepath.Join(dir, "data"), "--node-id=" + scaleNode, "--engine=dir", "--kubelet-root=" + filepath.Join(dir, "kubelet")}
	ready := testdriver.ReadyWait{Total: 2 * time.Minute, Probe: time.Second, Poll: 5 * time.Millisecond}
	nodeProc := testdriver.Launch(b, bin.Path(b), nodeArgs)
	nodeProc.WaitReady(b, nodeEP, ready)
	ctrl := testdriver.Launch(b, bin.Path(b), []string{"--mode=controller", "--endpoint=" + ctrlEP, "--kubeconfig=" + ctrlID.Kubeconfig})
	ctrl.WaitReady(b, ctrlEP, ready)
	env.WaitLocalNode(b, scaleNode)
	cc := csi.NewControllerClient(ctrl.Conn)

	at0 := createLatency(b, cc, "first", 20)
	t0 := time.Now()
	csitest.Each(b, n, 32, func(i int) error { return createOne(cc, fmt.Sprintf("bulk-%05d", i)) })
	createRate := float64(n) / time.Since(t0).Seconds()
	atN := createLatency(b, cc, "then", 20)
	ctrlRSS, nodeRSS := rss(b, ctrl), rss(b, nodeProc)

	// SIGKILL the node plugin and start it again.
	prev := heartbeat(b, env)
	nodeProc.Kill()
	restart := time.Now()
	nodeProc = testdriver.Launch(b, bin.Path(b), nodeArgs)
	nodeProc.WaitReady(b, nodeEP, ready)
	serving := time.Since(restart)
	fresh := waitHeartbeat(b, env, prev, restart)
	// A volume created now waits behind the reconciles of all n others.
	if err := createOne(cc, "after-restart"); err != nil {
		b.Fatal(err)
	}
	caughtUp := time.Since(restart)
	lvs := &v1.LocalVolumeList{}
	if err := env.Client.List(context.Background(), lvs); err != nil {
		b.Fatal(err)
	}
	notReady := 0
	for _, lv := range lvs.Items {
		if lv.Status.Phase != v1.PhaseReady {
			notReady++
		}
	}
	if len(lvs.Items) != n+41 || notReady != 0 {
		b.Fatalf("%d LocalVolumes, %d not Ready; want %d, all Ready", len(lvs.Items), notReady, n+41)
	}
	nodeRSSAfter := rss(b, nodeProc)

	t1 := time.Now()
	csitest.Each(b, len(lvs.Items), 32, func(i int) error {
		_, err := cc.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: lvs.Items[i].Name})
		return err
	})
	deleteRate := float64(len(lvs.Items)) / time.Since(t1).Seconds()

	b.Logf("SCALE one node, %d volumes: CreateVolume p50 %.1f ms at 0 volumes, %.1f ms at %d (%.2fx); %.0f creates/s, %.0f deletes/s (32 at once)",
		n, ms(at0), ms(atN), n, float64(atN)/float64(at0), createRate, deleteRate)
	b.Logf("SCALE one node, %d volumes: RSS controller %.0f MiB, node plugin %.0f MiB (%.0f MiB after its restart)", n, ctrlRSS, nodeRSS, nodeRSSAfter)
	b.Logf("SCALE one node, %d volumes: node plugin SIGKILLed and started: serving after %.2fs, fresh LocalNode heartbeat after %.2fs, a new volume Ready after %.2fs",
		n, serving.Seconds(), fresh.Seconds(), caughtUp.Seconds())
	b.ReportMetric(ms(at0), "create-at-0-ms")
	b.ReportMetric(ms(atN), "create-at-N-ms")
	b.ReportMetric(createRate, "creates/s")
	b.ReportMetric(deleteRate, "deletes/s")
	b.ReportMetric(ctrlRSS, "controller-MiB")
	b.ReportMetric(nodeRSS, "node-MiB")
	b.ReportMetric(caughtUp.Seconds(), "restart-s")
}

func createOne(cc csi.ControllerClient, name string) error {
	_, err := cc.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}, AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
	})
	return err
}

// createLatency creates count volumes one after another and returns the
// median CreateVolume latency.
func createLatency(b *testing.B, cc csi.ControllerClient, prefix string, count int) time.Duration {
	var lat []time.Duration
	for i := range count {
		t0 := time.Now()
		if err := createOne(cc, fmt.Sprintf("%s-%02d", prefix, i)); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2]
}

// heartbeat is the LocalNode's last heartbeat.
func heartbeat(b *testing.B, env *clustertest.Env) time.Time {
	ln := &v1.LocalNode{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: scaleNode}, ln); err != nil {
		b.Fatal(err)
	}
	return ln.Status.Heartbeat.Time
}

// waitHeartbeat waits until the LocalNode's heartbeat is no longer prev,
// the one before the restart at since, and returns how long after since
// it came.
func waitHeartbeat(b *testing.B, env *clustertest.Env, prev, since time.Time) time.Duration {
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !heartbeat(b, env).Equal(prev) {
			return time.Since(since)
		}
	}
	b.Fatal("no fresh LocalNode heartbeat within 2 minutes of the restart")
	return 0
}

// rss is a process's resident memory in MiB (/proc/<pid>/status VmRSS).
func rss(b *testing.B, p *testdriver.Proc) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// envCount is the number in the environment variable name, or def when it
// is unset.
func envCount(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
