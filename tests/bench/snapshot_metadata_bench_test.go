package bench

import (
	"bufio"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// BenchmarkSnapshotMetadata times the SnapshotMetadata service through the
// CSI socket on a 10 GiB raw block volume: GetMetadataAllocated of a
// snapshot with 1 GiB written (1 MiB writes at random places), then
// GetMetadataDelta between it and a second snapshot after 100 MiB more
// were changed in writes of 4 KiB to 1 MiB at random places; with the
// bytes the driver's process read meanwhile (/proc/self/io rchar, the
// socket's few KiB included) and how much the delta named. Data roots:
// btrfs and XFS-reflink (answered from the extent maps), ext4 (snapshots
// are copies: blocks are compared where the extents differ).
func BenchmarkSnapshotMetadata(b *testing.B) {
	for _, fs := range []string{testfs.Btrfs, testfs.XFSReflink, testfs.Ext4} {
		b.Run(fs, func(b *testing.B) {
			for range b.N {
				benchSnapshotMetadata(b, fs)
			}
		})
	}
}

func benchSnapshotMetadata(b *testing.B, fs string) {
	const size = 10 << 30
	root := testfs.NewDirect(b, fs, 16<<30)
	in := testdriver.Start(b, func(o *driver.Options) {
		o.DataRoot = filepath.Join(root, "data")
		o.CapacityBytes = 1 << 40
	})
	ctx, cancel := call()
	defer cancel()
	resp, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "cbt", CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
	})
	if err != nil {
		b.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	// The volume is not staged: its image is written directly, as a pod
	// would through the loop device.
	img, err := os.OpenFile(filepath.Join(in.Opts.DataRoot, "block", id+".img"), os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer img.Close()
	r := rand.New(rand.NewSource(1))
	write := func(total int64, minLen, maxLen int) {
		buf := make([]byte, maxLen)
		r.Read(buf)
		for done := int64(0); done < total; {
			n := minLen + r.Intn(maxLen-minLen+1)
			n = n &^ (contract.BlockBytes - 1)
			off := r.Int63n((size-int64(n))/contract.BlockBytes) * contract.BlockBytes
			buf[0]++ // every write new bytes
			if _, err := img.WriteAt(buf[:n], off); err != nil {
				b.Fatal(err)
			}
			done += int64(n)
		}
		if err := img.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	snap := func(name string) string {
		ctx, cancel := call()
		defer cancel()
		s, err := in.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: name})
		if err != nil {
			b.Fatal(err)
		}
		return s.GetSnapshot().GetSnapshotId()
	}
	write(1<<30, 1<<20, 1<<20)
	s1 := snap("s1")
	write(100<<20, 4096, 1<<20)
	s2 := snap("s2")
	sm := csi.NewSnapshotMetadataClient(in.Conn)

	measure := func(what string, recv func() (int, int64, error)) {
		read0 := rchar(b)
		start := time.Now()
		ranges, bytes, err := recv()
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		d := time.Since(start)
		read := rchar(b) - read0
		fmt.Printf("CBT %-12s %-22s %8.3f s  %7d ranges  %9.1f MiB named  %9.1f MiB read\n",
			fs, what, d.Seconds(), ranges, float64(bytes)/(1<<20), float64(read)/(1<<20))
		b.ReportMetric(d.Seconds(), what+"-s")
		b.ReportMetric(float64(read)/(1<<20), what+"-MiB-read")
	}
	measure("allocated-1GiB", func() (int, int64, error) {
		st, err := sm.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: s1})
		if err != nil {
			return 0, 0, err
		}
		return drain(st.Recv)
	})
	measure("delta-100MiB", func() (int, int64, error) {
		st, err := sm.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2})
		if err != nil {
			return 0, 0, err
		}
		return drain(st.Recv)
	})
}

// drain reads a SnapshotMetadata stream to its end: ranges and bytes named.
func drain[M interface{ GetBlockMetadata() []*csi.BlockMetadata }](recv func() (M, error)) (int, int64, error) {
	var n int
	var bytes int64
	for {
		m, err := recv()
		if err == io.EOF {
			return n, bytes, nil
		}
		if err != nil {
			return n, bytes, err
		}
		for _, r := range m.GetBlockMetadata() {
			n++
			bytes += r.GetSizeBytes()
		}
	}
}

// rchar is the bytes this process read so far (/proc/self/io).
func rchar(b *testing.B) int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "rchar: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	b.Fatal("no rchar in /proc/self/io")
	return 0
}
