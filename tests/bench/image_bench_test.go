package bench

// Image volume benchmarks (csi.storage.k8s.io/fstype ext4 or xfs): the
// latency of CreateVolume (the image file, fallocate'd) and of the first
// NodeStageVolume (loop device, mkfs, mount), and of CreateSnapshot of a
// staged image volume holding 200 MiB of data (freeze, reflink or copy of
// the image, thaw):
//
//	BenchmarkImageExt4OnExt4      ext4 images on an ext4 data root (the snapshot copies)
//	BenchmarkImageXFSOnXFSReflink xfs images on XFS with reflink (the snapshot reflinks)
//
// Figures: create-ms, first-stage-ms, snapshot-ms. The data is written and
// synced before the snapshot is timed.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

func BenchmarkImageExt4OnExt4(b *testing.B) { benchImage(b, testfs.Ext4, "ext4", 256<<20) }

func BenchmarkImageXFSOnXFSReflink(b *testing.B) {
	benchImage(b, testfs.XFSReflink, "xfs", 320<<20)
}

func benchImage(b *testing.B, fs, fsType string, size int64) {
	testdriver.RequireRoot(b)
	root := testfs.New(b, fs, 2<<30)
	in := testdriver.Start(b, func(o *driver.Options) {
		o.DataRoot = filepath.Join(root, "data")
		o.Engine = "dir"
		o.CapacityBytes = 0
	})
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	var createT, stageT, snapT time.Duration
	for i := 0; i < b.N; i++ {
		ctx, cancel := call()
		start := time.Now()
		r, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "img", CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{capability},
		})
		createT += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		id := r.GetVolume().GetVolumeId()
		staging := filepath.Join(in.Dir, "staging")
		mkdirs(b, staging)
		start = time.Now()
		if _, err := in.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability}); err != nil {
			b.Fatal(err)
		}
		stageT += time.Since(start)
		data := bytes.Repeat([]byte{0x5a, 0xa5}, 1<<19)
		for f := range 200 {
			if err := os.WriteFile(filepath.Join(staging, fmt.Sprintf("f%03d", f)), data, 0o600); err != nil {
				b.Fatal(err)
			}
		}
		unix.Sync()
		start = time.Now()
		s, err := in.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: "img-snap"})
		snapT += time.Since(start)
		if err != nil || !s.GetSnapshot().GetReadyToUse() {
			b.Fatalf("CreateSnapshot: %v %v", s, err)
		}
		if _, err := in.Controller.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshot().GetSnapshotId()}); err != nil {
			b.Fatal(err)
		}
		if _, err := in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			b.Fatal(err)
		}
		if err := deleteVolumeErr(in.Controller, id); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
	n := float64(b.N)
	b.ReportMetric(float64(createT.Microseconds())/1000/n, "create-ms")
	b.ReportMetric(float64(stageT.Microseconds())/1000/n, "first-stage-ms")
	b.ReportMetric(float64(snapT.Microseconds())/1000/n, "snapshot-ms")
}
