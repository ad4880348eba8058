package multinode

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// BenchmarkTransfer restores a snapshot of a raw block volume holding 1 GiB
// of random data onto the other node (two node plugins against a real API
// server, the channel's TLS over loopback, both data roots on this
// machine's disk), and in the same sitting copies the same image file
// between the two data roots with cp and a sync: restore-MB/s, cp-MB/s and
// their ratio. Then a 10 GiB image with 1 GiB written: the bytes that cross.
func BenchmarkTransfer(b *testing.B) {
	c := startTransferNodes(b, 16<<30, 16<<30)
	ctx := context.Background()
	root0, root1 := c.nodes["node-0"].Opts.DataRoot, c.nodes["node-1"].Opts.DataRoot
	pin0 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}
	pin1 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}, Preferred: []*csi.Topology{topologyOf("node-1")}}
	snapshotOf := func(name string, size, data int64) (*csi.VolumeContentSource, string) {
		resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name, VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: size}, AccessibilityRequirements: pin0,
		})
		if err != nil {
			b.Fatal(err)
		}
		f, err := os.OpenFile(filepath.Join(root0, "block", resp.GetVolume().GetVolumeId()+".img"), os.O_WRONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 4<<20)
		rng := rand.NewChaCha8([32]byte{1})
		for off := int64(0); off < data; off += int64(len(buf)) {
			_, _ = rng.Read(buf)
			if _, err := f.WriteAt(buf, off*(size/data)); err != nil { // spread over the image
				b.Fatal(err)
			}
		}
		f.Close()
		snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + name, SourceVolumeId: resp.GetVolume().GetVolumeId()})
		if err != nil {
			b.Fatal(err)
		}
		id := snap.GetSnapshot().GetSnapshotId()
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}},
			filepath.Join(root0, "snapshots", id+".img")
	}
	restore := func(name string, size int64, cs *csi.VolumeContentSource) (time.Duration, int64) {
		start := time.Now()
		resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name, VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
			VolumeContentSource: cs, AccessibilityRequirements: pin1,
		})
		if err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		lv := &v1.LocalVolume{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: resp.GetVolume().GetVolumeId()}, lv); err != nil {
			b.Fatal(err)
		}
		if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			b.Fatal(err)
		}
		return d, lv.Status.Transfer.BytesDone.Value()
	}
	const gib = int64(1 << 30)
	cs, img := snapshotOf("dense", gib, gib)
	var restoreT, cpT time.Duration
	// Round 0 is not counted: on a virtual machine the first use of a
	// page of memory costs the guest several times a later one (the host
	// backs it), and a 1 GiB copy into fresh page cache measures that.
	for i := 0; i <= b.N; i++ {
		// Each measured copy ends in a syncfs: start both with nothing
		// else dirty.
		unix.Sync()
		d, _ := restore("dense-copy", gib, cs)
		dst := filepath.Join(root1, "cp.img")
		unix.Sync()
		start := time.Now()
		if out, err := exec.Command("cp", "--sparse=auto", img, dst).CombinedOutput(); err != nil {
			b.Fatalf("cp: %v: %s", err, out)
		}
		if out, err := exec.Command("sync", "-f", dst).CombinedOutput(); err != nil {
			b.Fatalf("sync: %v: %s", err, out)
		}
		if i > 0 {
			restoreT += d
			cpT += time.Since(start)
		}
		_ = os.Remove(dst)
		waitGone(b, c, lcluster.VolumeIDFor("dense-copy"))
	}
	mb := float64(gib) / 1e6 * float64(b.N)
	b.ReportMetric(mb/restoreT.Seconds(), "restore-MB/s")
	b.ReportMetric(mb/cpT.Seconds(), "cp-MB/s")
	b.ReportMetric(cpT.Seconds()/restoreT.Seconds(), "restore/cp")

	sparse, _ := snapshotOf("sparse", 10*gib, gib)
	_, moved := restore("sparse-copy", 10*gib, sparse)
	b.ReportMetric(float64(moved)/float64(gib), "sparse10GiB-GiB-moved")
}

// waitGone waits until the LocalVolume id is deleted (its data removed).
func waitGone(b *testing.B, c *fixture, id string) {
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: id}, &v1.LocalVolume{})
		if client.IgnoreNotFound(err) == nil && err != nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("LocalVolume %s still there: %v", id, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
