package multinode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/tests/fio"
)

// BenchmarkFioSnapshotCopies: what keeping snapshot copies costs a pod's
// writes between copies. An ext4 image volume on node-0, staged and
// published by node-0's plugin as the kubelet would, is snapshotted
// alternately by a class without copies and by one with copies "2" (the
// copy on node-1 waited for, the snapshot then deleted); after each, the
// fsync'd and the O_DIRECT random-write jobs of tests/fio run on it. The
// figures are the medians over the rounds, and copies-x the ratio of the
// runs after copied snapshots to those after plain ones (1: no cost).
func BenchmarkFioSnapshotCopies(b *testing.B) {
	if err := fio.Check(); err != nil {
		b.Fatal(err)
	}
	c := startTransferNodes(b, 4<<30, 4<<30)
	ctx := context.Background()
	capb := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "fio", VolumeCapabilities: []*csi.VolumeCapability{capb}, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}},
	})
	if err != nil {
		b.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	node := c.nodes["node-0"]
	staging, target := filepath.Join(node.Dir, "fio-staging"), filepath.Join(node.Dir, "fio-target")
	if err := os.Mkdir(staging, 0o750); err != nil {
		b.Fatal(err)
	}
	if _, err := node.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capb}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = node.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	})
	if _, err := node.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capb}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = node.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	})
	const size = 256 << 20
	if err := fio.Prepare(ctx, target, size); err != nil {
		b.Fatal(err)
	}
	jobs := []fio.Job{fio.Jobs[0], fio.Jobs[1]}
	figures := map[string][]float64{} // "<copies>/<job>" → per round
	for round := range 3 * b.N {
		for _, copies := range []string{"1", "2"} {
			name := fmt.Sprintf("snap-%d-%s", round, copies)
			snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id, Parameters: map[string]string{"copies": copies}})
			if err != nil {
				b.Fatal(err)
			}
			sid := snap.GetSnapshot().GetSnapshotId()
			if copies == "2" {
				readyCopy(b, c, sid, "node-1")
			}
			for _, job := range jobs {
				v, err := fio.Run(ctx, job, target, size, 6*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				figures[copies+"/"+job.Name] = append(figures[copies+"/"+job.Name], v)
			}
			if _, err := c.ctrl.Controller.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, job := range jobs {
		plain, copied := median(figures["1/"+job.Name]), median(figures["2/"+job.Name])
		fmt.Printf("FIO copies %-30s plain %10.1f  with copies %10.1f  %.2fx\n", job.Name, plain, copied, copied/plain)
		b.ReportMetric(plain, job.Name+"-plain-"+job.Unit())
		b.ReportMetric(copied, job.Name+"-copies-"+job.Unit())
		b.ReportMetric(copied/plain, job.Name+"-copies-x")
	}
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}
