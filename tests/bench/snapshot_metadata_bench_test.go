package bench

import (
	"bufio"
	"context"
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
// bytes the driver's process read meanwhile (/proc/<pid>/io rchar, the
// socket's few KiB included) and how much the answers named. localdir's
// data roots: btrfs and XFS-reflink (answered from the extent maps), ext4
// (snapshots are copies: blocks are compared where the extents differ);
// then, in the same sitting and with the same writes, csi-driver-host-path
// (--enable-snapshot-metadata, its state on the machine's ext4 disk),
// which compares the two snapshots' files byte by byte (skipped without
// its binary, as BenchmarkPairsVsHostPath).
func BenchmarkSnapshotMetadata(b *testing.B) {
	for _, fs := range []string{testfs.Btrfs, testfs.XFSReflink, testfs.Ext4} {
		b.Run(fs, func(b *testing.B) {
			for range b.N {
				root := testfs.NewDirect(b, fs, 16<<30)
				in := testdriver.Start(b, func(o *driver.Options) {
					o.DataRoot = filepath.Join(root, "data")
					o.CapacityBytes = 1 << 40
				})
				benchCBT(b, "localdir "+fs, in.Controller, csi.NewSnapshotMetadataClient(in.Conn),
					func(id string) string { return filepath.Join(in.Opts.DataRoot, "block", id+".img") },
					func() int64 { return rchar(b, "self") })
			}
		})
	}
	b.Run("host-path", func(b *testing.B) {
		bin, err := hostPathBinary()
		if err != nil {
			b.Skip(err)
		}
		for range b.N {
			hp := launchHostPath(b, bin, "", "--enable-snapshot-metadata", "--snapshot-metadata-block-type=VARIABLE_LENGTH")
			benchCBT(b, "host-path ext4", csi.NewControllerClient(hp.conn), csi.NewSnapshotMetadataClient(hp.conn),
				func(id string) string { return filepath.Join(hp.stateDir, id) },
				func() int64 { return rchar(b, strconv.Itoa(hp.proc.Cmd.Process.Pid)) })
		}
	})
}

// benchCBT runs the measurement on one driver: image is where a raw block
// volume's data lives, read the driver process's rchar.
func benchCBT(b *testing.B, name string, ctl csi.ControllerClient, sm csi.SnapshotMetadataClient, image func(id string) string, read func() int64) {
	const size = 10 << 30
	ctx, cancel := call()
	defer cancel()
	resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{
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
	// Deleted at the end, snapshots first: host-path attaches a loop device
	// to a block volume's file, detached only by DeleteVolume.
	var snaps []string
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		for _, s := range snaps {
			if _, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s}); err != nil {
				b.Errorf("DeleteSnapshot %s: %v", s, err)
			}
		}
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			b.Errorf("DeleteVolume %s: %v", id, err)
		}
	}()
	// The volume is not staged: its image is written directly, as a pod
	// would through the loop device.
	img, err := os.OpenFile(image(id), os.O_RDWR, 0)
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
		// host-path copies the whole image: minutes, not seconds.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		s, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: name})
		if err != nil {
			b.Fatal(err)
		}
		snaps = append(snaps, s.GetSnapshot().GetSnapshotId())
		return s.GetSnapshot().GetSnapshotId()
	}
	write(1<<30, 1<<20, 1<<20)
	s1 := snap("s1")
	write(100<<20, 4096, 1<<20)
	s2 := snap("s2")

	measure := func(what string, recv func() (int, int64, error)) {
		read0 := read()
		start := time.Now()
		ranges, bytes, err := recv()
		if err != nil {
			b.Fatalf("%s: %v", what, err)
		}
		d := time.Since(start)
		n := read() - read0
		fmt.Printf("CBT %-20s %-16s %8.3f s  %7d ranges  %9.1f MiB named  %9.1f MiB read\n",
			name, what, d.Seconds(), ranges, float64(bytes)/(1<<20), float64(n)/(1<<20))
		b.ReportMetric(d.Seconds(), what+"-s")
		b.ReportMetric(float64(n)/(1<<20), what+"-MiB-read")
	}
	measure("allocated-1GiB", func() (int, int64, error) {
		st, err := sm.GetMetadataAllocated(context.Background(), &csi.GetMetadataAllocatedRequest{SnapshotId: s1})
		if err != nil {
			return 0, 0, err
		}
		return drain(st.Recv)
	})
	measure("delta-100MiB", func() (int, int64, error) {
		st, err := sm.GetMetadataDelta(context.Background(), &csi.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2})
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

// rchar is the bytes process pid ("self": this one) read so far
// (/proc/<pid>/io).
func rchar(b *testing.B, pid string) int64 {
	f, err := os.Open("/proc/" + pid + "/io")
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
