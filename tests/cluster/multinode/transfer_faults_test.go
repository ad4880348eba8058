package multinode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/testfs"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

// blockSource creates a raw block volume on node-0 holding n random bytes at
// offset 0 and a snapshot of it; it returns the snapshot's content source
// and the data.
func blockSource(t *testing.T, c *fixture, name string, n int) (*csi.VolumeContentSource, []byte) {
	t.Helper()
	ctx := context.Background()
	pin0 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}
	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi}, AccessibilityRequirements: pin0,
	})
	if err != nil {
		t.Fatal(err)
	}
	data := treecmp.RandomBytes(uint64(len(name)), n)
	img := filepath.Join(c.nodes["node-0"].Opts.DataRoot, "block", resp.GetVolume().GetVolumeId()+".img")
	if err := os.WriteFile(img, data, 0o600); err != nil { // shorter than the image: truncates it; grown back below
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64*mi); err != nil {
		t.Fatal(err)
	}
	snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + name, SourceVolumeId: resp.GetVolume().GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}, data
}

// restoreOnto1 starts a CreateVolume restoring cs onto node-1 at bandwidth
// bytes per second, retried as the provisioner retries (DEADLINE_EXCEEDED,
// ABORTED); the result arrives on the channel.
func restoreOnto1(c *fixture, name, bandwidth string, cs *csi.VolumeContentSource) <-chan error {
	pin1 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}, Preferred: []*csi.Topology{topologyOf("node-1")}}
	errc := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			_, err := c.ctrl.Controller.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
				Name: name, VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi},
				VolumeContentSource: cs, AccessibilityRequirements: pin1,
				Parameters: map[string]string{contract.ParamTransferBandwidth: bandwidth},
			})
			if code := status.Code(err); (code == codes.DeadlineExceeded || code == codes.Aborted) && time.Now().Before(deadline) {
				continue
			}
			errc <- err
			return
		}
	}()
	return errc
}

// transferOf waits until the LocalVolume of CSI name reports cond of its
// transfer, and returns it.
func transferOf(t *testing.T, c *fixture, name string, what string, cond func(*v1.LocalVolume) bool) *v1.LocalVolume {
	t.Helper()
	lv := &v1.LocalVolume{}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: lcluster.VolumeIDFor(name)}, lv)
		if err == nil && cond(lv) {
			return lv
		}
		if time.Now().After(deadline) {
			t.Fatalf("LocalVolume of %s: %s did not happen (%v, status %+v)", name, what, err, lv.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func moving(lv *v1.LocalVolume) bool {
	return lv.Status.Transfer != nil && lv.Status.Transfer.BytesDone.Value() > 0 && lv.Status.Transfer.CompletionTime == nil
}

func imageOn(t *testing.T, p *clustertest.Plugin, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.Opts.DataRoot, "block", lcluster.VolumeIDFor(name)+".img"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// creating lists the .creating- entries of a data root's block/ folder.
func creating(t *testing.T, p *clustertest.Plugin) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(p.Opts.DataRoot, "block"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".creating-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestTransferSurvivesNodePluginRestarts stops the source's node plugin,
// then the target's, in the middle of a transfer (slowed down by the
// transferBandwidth parameter): each time the transfer starts over once the
// plugin is back, and the volume is made only from a whole, verified
// stream. The source holds 32 MiB, more than the loopback sockets buffer
// (about 10 MiB), so the stop lands while the sender still has data to send.
func TestTransferSurvivesNodePluginRestarts(t *testing.T) {
	c := startTransferNodes(t, 500*mi, 500*mi)
	cs, data := blockSource(t, c, "src", 32*mi)
	parent := t
	for _, side := range []string{"node-0", "node-1"} {
		t.Run("stop "+side, func(t *testing.T) {
			name := "restore-stop-" + side
			errc := restoreOnto1(c, name, "4Mi", cs)
			transferOf(t, c, name, "bytes arriving", moving)
			p := c.nodes[side]
			p.Stop(t)
			time.Sleep(time.Second)
			c.nodes[side] = c.env.StartNodeWith(parent, p.Dir, p.Opts)
			if err := <-errc; err != nil {
				t.Fatalf("restore after %s restarted: %v", side, err)
			}
			lv := transferOf(t, c, name, "completion", func(lv *v1.LocalVolume) bool { return lv.Status.Phase == v1.PhaseReady })
			if tr := lv.Status.Transfer; tr == nil || tr.Attempts < 2 || tr.CompletionTime == nil {
				t.Errorf("transfer status %+v, want two attempts or more and a completion", tr)
			}
			got := imageOn(t, c.nodes["node-1"], name)
			if len(got) != 64*mi || !bytes.Equal(got[:len(data)], data) || bytes.Count(got[len(data):], []byte{0}) != len(got)-len(data) {
				t.Errorf("the restored image differs from the snapshot (%d bytes)", len(got))
			}
			if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
				t.Errorf("left behind on node-1: %v", left)
			}
		})
	}
}

// TestTransferTargetOutOfRoom fills the target's filesystem during a
// transfer: the volume fails with RESOURCE_EXHAUSTED, nothing of it stays
// on the target, and its room is given back.
func TestTransferTargetOutOfRoom(t *testing.T) {
	env := clustertest.Start(t)
	c := &fixture{env: env, nodes: map[string]*clustertest.Plugin{}}
	small := testfs.New(t, testfs.XFSReflink, 320*mi)
	for i, mutate := range []func(*driver.Options){
		func(o *driver.Options) { o.TransferAddress = "127.0.0.1:0" },
		func(o *driver.Options) { o.TransferAddress = "127.0.0.1:0"; o.DataRoot = filepath.Join(small, "data") },
	} {
		name := fmt.Sprintf("node-%d", i)
		c.nodes[name] = env.StartNode(t, name, mutate)
		env.WaitLocalNode(t, name)
	}
	c.ctrl = env.StartController(t, nil)
	cs, _ := blockSource(t, c, "src", 40*mi)
	free := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(small, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	before := free()
	errc := restoreOnto1(c, "full", "4Mi", cs)
	transferOf(t, c, "full", "bytes arriving", moving)
	// Another tenant of the filesystem takes all but 1 MiB.
	filler := filepath.Join(small, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free()-mi); err != nil {
		t.Fatal(err)
	}
	f.Close()
	err = <-errc
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("restore onto a full node: %v, want ResourceExhausted", err)
	}
	t.Logf("restore onto a full node: %v", err)
	if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// XFS frees a removed file's blocks in the background.
	deadline := time.Now().Add(30 * time.Second)
	for after := free(); after < before-4*mi; after = free() {
		if time.Now().After(deadline) {
			t.Fatalf("free space %d before the transfer, %d after: its room was not given back", before, after)
		}
		unix.Sync()
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTransferSourceNodeGone stops the source's node plugin for good in the
// middle of a transfer. While its node may come back the transfer retries,
// and CreateVolume's DEADLINE_EXCEEDED says why (the provisioner puts that
// message in the PVC's Events); once the node has not reported for longer
// than a transfer waits for it, the volume fails with NOT_FOUND naming the
// node, a new restore is refused at once naming it, and nothing is left on
// the target.
func TestTransferSourceNodeGone(t *testing.T) {
	c := startTransferNodes(t, 500*mi, 500*mi)
	// 20 s of copying at 2 MiB/s: node-0 stops long before the copy could
	// end, however slowly a loaded machine notices the first bytes.
	cs, _ := blockSource(t, c, "src", 40*mi)
	ctx := context.Background()
	heartbeat := func(ago time.Duration) {
		t.Helper()
		ln := &v1.LocalNode{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: "node-0"}, ln); err != nil {
			t.Fatal(err)
		}
		old := ln.DeepCopy()
		ln.Status.Heartbeat.Time = time.Now().Add(-ago)
		if err := c.env.Client.Status().Patch(ctx, ln, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
	}
	restore := func(wait time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		_, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "orphan", VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi},
			VolumeContentSource: cs, AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}},
			Parameters: map[string]string{contract.ParamTransferBandwidth: "2Mi"},
		})
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- restore(5 * time.Second) }()
	transferOf(t, c, "orphan", "bytes arriving", moving)
	c.nodes["node-0"].Stop(t)
	<-errc

	err := restore(10 * time.Second)
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "TransferRetrying") || !strings.Contains(err.Error(), "from node node-0 failed") {
		t.Fatalf("restore from a node that is down: %v, want DEADLINE_EXCEEDED saying the copy from node-0 is retried and why", err)
	}
	t.Logf("while node-0 is down: %v", err)

	heartbeat(11 * time.Minute) // gone for good
	err = restore(2 * time.Minute)
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "node-0") || !strings.Contains(err.Error(), "gone") {
		t.Fatalf("the transfer from a node gone for good: %v, want NOT_FOUND saying node-0 is gone", err)
	}
	t.Logf("node-0 gone: %v", err)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		// ABORTED while the failed volume is being removed, as the
		// provisioner would see it.
		if err = restore(30 * time.Second); status.Code(err) != codes.Aborted || time.Now().After(deadline) {
			break
		}
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "node node-0, whose node plugin has not reported") {
		t.Fatalf("a new restore from a node gone for good: %v, want RESOURCE_EXHAUSTED saying node-0 does not report", err)
	}
	t.Logf("a new restore: %v", err)
	lv := &v1.LocalVolume{}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: lcluster.VolumeIDFor("orphan")}, lv); err == nil {
		t.Errorf("LocalVolume of the failed restore left behind: %+v", lv.Status)
	}
	if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
		t.Errorf("left behind on node-1: %v", left)
	}
}
