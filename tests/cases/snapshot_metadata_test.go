package cases

import (
	"bytes"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// The SnapshotMetadata service as a backup tool uses it, through the CSI
// socket in all mode, on btrfs, XFS-reflink and ext4 data roots: a raw
// block volume changed through its loop device (whole and partial blocks,
// zeros, BLKDISCARD) and an ext4 image volume changed through its
// filesystem (files written, overwritten in part, truncated and regrown,
// removed, fstrim) are snapshotted round after round. Each snapshot is
// rebuilt from the previous one and the ranges GetMetadataDelta names, read
// from the snapshot (as a backup tool reads it), and from zeros and the
// ranges GetMetadataAllocated names; both must equal the snapshot byte for
// byte. A changed block left out fails the test.
func TestSnapshotMetadataRebuildsEverySnapshot(t *testing.T) {
	for _, kind := range []string{testfs.Btrfs, testfs.XFSReflink, testfs.Ext4} {
		t.Run(kind, func(t *testing.T) {
			root := filepath.Join(testfs.New(t, kind, 1<<30), "data")
			in := testdriver.Start(t, func(o *driver.Options) { o.DataRoot = root })
			sm := csi.NewSnapshotMetadataClient(in.Conn)
			r := rand.New(rand.NewSource(int64(len(kind))))

			t.Run("block", func(t *testing.T) {
				id := createBlock(t, in, "cbt-block", 32*csitest.Mi)
				staging := filepath.Join(in.Dir, "staging-block")
				stageBlock(t, in, id, staging)
				defer unstageBlock(t, in, id, staging)
				dev, err := os.OpenFile(filepath.Join(staging, id), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer dev.Close()
				rounds(t, in, sm, id, 6, func() { changeDevice(t, r, dev, 32*csitest.Mi) })
			})
			t.Run("ext4", func(t *testing.T) {
				resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
					Name: "cbt-ext4", CapacityRange: csitest.Range(64*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS("ext4")},
				})
				csitest.MustCode(t, err, codes.OK, "CreateVolume ext4")
				id := resp.GetVolume().GetVolumeId()
				staging := csitest.Mkdir(t, filepath.Join(in.Dir, "staging-ext4"))
				_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
					VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.MntCapFS("ext4"),
				})
				csitest.MustCode(t, err, codes.OK, "NodeStageVolume ext4")
				defer unstage(t, in, id, staging)
				rounds(t, in, sm, id, 6, func() { changeFiles(t, r, staging) })
			})
		})
	}
}

// rounds snapshots volume id n+1 times, calling change between two, and
// checks each snapshot's allocated ranges and its delta from the one before.
func rounds(t *testing.T, in *testdriver.Instance, sm csi.SnapshotMetadataClient, id string, n int, change func()) {
	t.Helper()
	snap := func(i int) *csi.Snapshot {
		resp, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: fmt.Sprintf("%s-s%d", id, i)})
		csitest.MustCode(t, err, codes.OK, "CreateSnapshot")
		return resp.GetSnapshot()
	}
	change()
	prev := snap(0)
	checkAllocatedRPC(t, in, sm, prev)
	for i := 1; i <= n; i++ {
		change()
		next := snap(i)
		checkAllocatedRPC(t, in, sm, next)
		reported, differ := checkDeltaRPC(t, in, sm, prev, next, 0)
		t.Logf("round %d: %d KiB of blocks differ, %d KiB reported", i, differ>>10, reported>>10)
		prev = next
	}
}

// changeDevice writes to a raw block device of size bytes as a pod would.
func changeDevice(t *testing.T, r *rand.Rand, dev *os.File, size int64) {
	t.Helper()
	const blk = 4096
	for range 1 + r.Intn(40) {
		off := r.Int63n(size/blk) * blk
		n := min(int64(1+r.Intn(64))*blk, size-off)
		var err error
		switch r.Intn(5) {
		case 0, 1:
			b := make([]byte, n)
			r.Read(b)
			_, err = dev.WriteAt(b, off)
		case 2: // a few bytes inside a block
			b := make([]byte, 1+r.Intn(200))
			r.Read(b)
			_, err = dev.WriteAt(b, off+int64(r.Intn(blk-len(b))))
		case 3: // zeros
			_, err = dev.WriteAt(make([]byte, n), off)
		case 4: // a discard: reads as zeros afterwards
			if err = dev.Sync(); err == nil {
				rng := [2]uint64{uint64(off), uint64(n)}
				if _, _, e := unix.Syscall(unix.SYS_IOCTL, dev.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&rng))); e != 0 {
					err = fmt.Errorf("BLKDISCARD: %w", e)
				}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
}

// changeFiles changes files in a mounted filesystem as a pod would, then
// trims it (its freed blocks are discarded to the image).
func changeFiles(t *testing.T, r *rand.Rand, dir string) {
	t.Helper()
	for range 1 + r.Intn(12) {
		p := filepath.Join(dir, fmt.Sprintf("f%d", r.Intn(8)))
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		switch r.Intn(4) {
		case 0: // a new part, possibly past the end (a hole between)
			b := make([]byte, 1+r.Intn(1<<20))
			r.Read(b)
			_, err = f.WriteAt(b, r.Int63n(4<<20))
		case 1: // a few bytes in the middle
			b := make([]byte, 1+r.Intn(300))
			r.Read(b)
			_, err = f.WriteAt(b, r.Int63n(fi.Size()+1))
		case 2: // truncated, then regrown with a hole
			if err = f.Truncate(fi.Size() / 3); err == nil {
				err = f.Truncate(fi.Size() + int64(r.Intn(1<<20)))
			}
		case 3:
			f.Close()
			err = os.Remove(p)
		}
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	rng := struct{ Start, Len, MinLen uint64 }{0, ^uint64(0), 0}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fitrim, uintptr(unsafe.Pointer(&rng))); e != 0 {
		t.Fatalf("FITRIM %s: %v", dir, e)
	}
}

// fitrim is FITRIM, _IOWR('X', 121, struct fstrim_range).
const fitrim = 0xC0185879

// snapImage reads snapshot s's image as a backup tool would (from the
// documented layout: <data root>/snapshots/<id>.img).
func snapImage(t testing.TB, in *testdriver.Instance, s *csi.Snapshot) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(in.Opts.DataRoot, "snapshots", s.GetSnapshotId()+".img"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// metadataStream is what both streaming responses have in common.
type metadataStream interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}

// recvRanges reads a stream to its end and checks what the spec asks of
// every message: one metadata type (VARIABLE_LENGTH), one capacity, at most
// maxResults ranges each, ranges strictly ascending, apart, none ending
// before start.
func recvRanges[M metadataStream](t testing.TB, recv func() (M, error), maxResults int, start int64) (ranges [][2]int64, capacity int64, msgs int, err error) {
	t.Helper()
	for {
		m, err := recv()
		if err == io.EOF {
			return ranges, capacity, msgs, nil
		}
		if err != nil {
			return ranges, capacity, msgs, err
		}
		msgs++
		if m.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH {
			t.Errorf("message %d: block_metadata_type %v", msgs, m.GetBlockMetadataType())
		}
		if msgs > 1 && m.GetVolumeCapacityBytes() != capacity {
			t.Errorf("message %d: volume_capacity_bytes %d, earlier %d", msgs, m.GetVolumeCapacityBytes(), capacity)
		}
		capacity = m.GetVolumeCapacityBytes()
		if maxResults > 0 && len(m.GetBlockMetadata()) > maxResults {
			t.Errorf("message %d: %d ranges, max_results %d", msgs, len(m.GetBlockMetadata()), maxResults)
		}
		for _, b := range m.GetBlockMetadata() {
			if b.GetSizeBytes() <= 0 || b.GetByteOffset() < 0 || b.GetByteOffset()+b.GetSizeBytes() > capacity {
				t.Errorf("range [%d, +%d) outside a volume of %d bytes", b.GetByteOffset(), b.GetSizeBytes(), capacity)
			}
			if b.GetByteOffset()+b.GetSizeBytes() <= start {
				t.Errorf("range [%d, +%d) ends before starting_offset %d", b.GetByteOffset(), b.GetSizeBytes(), start)
			}
			if k := len(ranges); k > 0 && ranges[k-1][0]+ranges[k-1][1] > b.GetByteOffset() {
				t.Errorf("range [%d, +%d) overlaps or precedes [%d, +%d)", b.GetByteOffset(), b.GetSizeBytes(), ranges[k-1][0], ranges[k-1][1])
			}
			ranges = append(ranges, [2]int64{b.GetByteOffset(), b.GetSizeBytes()})
		}
	}
}

func allocated(t testing.TB, sm csi.SnapshotMetadataClient, id string, start int64, maxResults int) ([][2]int64, int64, int, error) {
	st, err := sm.GetMetadataAllocated(csitest.Ctx(t), &csi.GetMetadataAllocatedRequest{SnapshotId: id, StartingOffset: start, MaxResults: int32(maxResults)})
	if err != nil {
		return nil, 0, 0, err
	}
	return recvRanges(t, st.Recv, maxResults, start)
}

func delta(t testing.TB, sm csi.SnapshotMetadataClient, base, target string, start int64, maxResults int) ([][2]int64, int64, int, error) {
	st, err := sm.GetMetadataDelta(csitest.Ctx(t), &csi.GetMetadataDeltaRequest{
		BaseSnapshotId: base, TargetSnapshotId: target, StartingOffset: start, MaxResults: int32(maxResults),
	})
	if err != nil {
		return nil, 0, 0, err
	}
	return recvRanges(t, st.Recv, maxResults, start)
}

// checkAllocatedRPC rebuilds snapshot s from zeros and its allocated ranges.
func checkAllocatedRPC(t *testing.T, in *testdriver.Instance, sm csi.SnapshotMetadataClient, s *csi.Snapshot) {
	t.Helper()
	want := snapImage(t, in, s)
	ranges, capacity, _, err := allocated(t, sm, s.GetSnapshotId(), 0, 0)
	csitest.MustCode(t, err, codes.OK, "GetMetadataAllocated")
	if capacity != s.GetSizeBytes() || capacity != int64(len(want)) {
		t.Fatalf("volume_capacity_bytes %d; the snapshot has %d bytes, its image %d", capacity, s.GetSizeBytes(), len(want))
	}
	got := make([]byte, len(want))
	for _, r := range ranges {
		copy(got[r[0]:r[0]+r[1]], want[r[0]:r[0]+r[1]])
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("snapshot %s rebuilt from its allocated ranges differs at byte %d", s.GetSnapshotId(), firstDifference(got, want))
	}
}

// checkDeltaRPC rebuilds target from base and the delta's ranges from
// start (the bytes below start taken from target, as an interrupted backup
// that resumes has them), with max_results 7 so the answer spans messages;
// it returns the bytes reported and the bytes of the 4 KiB blocks that
// differ.
func checkDeltaRPC(t *testing.T, in *testdriver.Instance, sm csi.SnapshotMetadataClient, base, target *csi.Snapshot, start int64) (reported, differ int64) {
	t.Helper()
	want, got := snapImage(t, in, target), snapImage(t, in, base)
	got = append(got, make([]byte, max(0, len(want)-len(got)))...)
	for i := 0; i < len(want); i += 4096 {
		if !bytes.Equal(got[i:min(i+4096, len(want))], want[i:min(i+4096, len(want))]) {
			differ += int64(min(4096, len(want)-i))
		}
	}
	copy(got[:start], want[:start])
	ranges, capacity, _, err := delta(t, sm, base.GetSnapshotId(), target.GetSnapshotId(), start, 7)
	csitest.MustCode(t, err, codes.OK, "GetMetadataDelta")
	if capacity != target.GetSizeBytes() {
		t.Errorf("volume_capacity_bytes %d, the target snapshot has %d", capacity, target.GetSizeBytes())
	}
	for _, r := range ranges {
		copy(got[r[0]:r[0]+r[1]], want[r[0]:r[0]+r[1]])
		reported += r[1]
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("snapshot %s rebuilt from %s and the delta's ranges differs at byte %d: a changed block was left out",
			target.GetSnapshotId(), base.GetSnapshotId(), firstDifference(got, want))
	}
	return reported, differ
}

func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// The SnapshotMetadata service's errors, each changing nothing: missing ids
// and a negative max_results are INVALID_ARGUMENT, unknown snapshots
// NOT_FOUND, a starting_offset that is negative or past the volume
// OUT_OF_RANGE, a directory volume's snapshot or two volumes' snapshots
// FAILED_PRECONDITION (no delta: the tool makes a full backup). An offset
// at the volume's end is an empty answer; a resumed query from any offset
// names no range that ends before it and leaves out nothing after it.
func TestSnapshotMetadataErrorsAndPaging(t *testing.T) {
	in := testdriver.Start(t, nil)
	sm := csi.NewSnapshotMetadataClient(in.Conn)
	caps, err := in.Identity.GetPluginCapabilities(csitest.Ctx(t), &csi.GetPluginCapabilitiesRequest{})
	csitest.MustCode(t, err, codes.OK, "GetPluginCapabilities")
	advertised := false
	for _, c := range caps.GetCapabilities() {
		advertised = advertised || c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
	}
	if !advertised {
		t.Error("SNAPSHOT_METADATA_SERVICE is not advertised")
	}

	const size = 8 * csitest.Mi
	a, b := createBlock(t, in, "cbt-a", size), createBlock(t, in, "cbt-b", size)
	staging := filepath.Join(in.Dir, "staging-a")
	stageBlock(t, in, a, staging)
	dev, err := os.OpenFile(filepath.Join(staging, a), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(7))
	snap := func(vol, name string) *csi.Snapshot {
		resp, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{SourceVolumeId: vol, Name: name})
		csitest.MustCode(t, err, codes.OK, "CreateSnapshot "+name)
		return resp.GetSnapshot()
	}
	changeDevice(t, r, dev, size)
	s1 := snap(a, "a1")
	changeDevice(t, r, dev, size)
	s2 := snap(a, "a2")
	dev.Close()
	unstageBlock(t, in, a, staging)
	sb := snap(b, "b1")
	dirVol := createVolume(t, in, "cbt-dir", csitest.Mi)
	sd := snap(dirVol.GetVolumeId(), "d1")
	const unknownSnap = "snap-0123456789abcdef0123456789abcdef"

	for _, tc := range []struct {
		name         string
		base, target string
		start        int64
		max          int
		want         codes.Code
	}{
		{"no snapshot_id", "", "", 0, 0, codes.InvalidArgument},
		{"no base_snapshot_id", "", "-", 0, 0, codes.InvalidArgument},
		{"no target_snapshot_id", s1.GetSnapshotId(), "", 0, 0, codes.InvalidArgument},
		{"negative max_results", "", s2.GetSnapshotId(), 0, -1, codes.InvalidArgument},
		{"unknown snapshot", "", unknownSnap, 0, 0, codes.NotFound},
		{"unknown base", unknownSnap, s2.GetSnapshotId(), 0, 0, codes.NotFound},
		{"unknown target", s1.GetSnapshotId(), unknownSnap, 0, 0, codes.NotFound},
		{"a volume id", "", a, 0, 0, codes.NotFound},
		{"negative starting_offset", "", s2.GetSnapshotId(), -1, 0, codes.OutOfRange},
		{"negative starting_offset, delta", s1.GetSnapshotId(), s2.GetSnapshotId(), -4096, 0, codes.OutOfRange},
		{"starting_offset past the end", "", s2.GetSnapshotId(), size + 1, 0, codes.OutOfRange},
		{"starting_offset past the end, delta", s1.GetSnapshotId(), s2.GetSnapshotId(), 2 * size, 0, codes.OutOfRange},
		{"a directory volume's snapshot", "", sd.GetSnapshotId(), 0, 0, codes.FailedPrecondition},
		{"a directory volume's snapshots, delta", sd.GetSnapshotId(), sd.GetSnapshotId(), 0, 0, codes.FailedPrecondition},
		{"snapshots of two volumes", sb.GetSnapshotId(), s2.GetSnapshotId(), 0, 0, codes.FailedPrecondition},
		{"starting_offset at the end", "", s2.GetSnapshotId(), size, 0, codes.OK},
		{"starting_offset at the end, delta", s1.GetSnapshotId(), s2.GetSnapshotId(), size, 0, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ranges [][2]int64
			var msgs int
			var err error
			if tc.base == "" && tc.name != "no base_snapshot_id" {
				ranges, _, msgs, err = allocated(t, sm, tc.target, tc.start, tc.max)
			} else {
				target := tc.target
				if target == "-" {
					target = s2.GetSnapshotId()
				}
				ranges, _, msgs, err = delta(t, sm, tc.base, target, tc.start, tc.max)
			}
			csitest.MustCode(t, err, tc.want, tc.name)
			if tc.want == codes.OK && (len(ranges) != 0 || msgs != 1) {
				t.Errorf("%d ranges in %d messages, want one message without ranges", len(ranges), msgs)
			}
		})
	}

	// Paging: one range per message gives the same ranges as the default.
	all, _, _, err := delta(t, sm, s1.GetSnapshotId(), s2.GetSnapshotId(), 0, 0)
	csitest.MustCode(t, err, codes.OK, "GetMetadataDelta")
	one, _, msgs, err := delta(t, sm, s1.GetSnapshotId(), s2.GetSnapshotId(), 0, 1)
	csitest.MustCode(t, err, codes.OK, "GetMetadataDelta, max_results 1")
	if fmt.Sprint(one) != fmt.Sprint(all) || msgs != len(all) {
		t.Errorf("max_results 1: %d messages with %v, want %d with %v", msgs, one, len(all), all)
	}
	if len(all) < 2 {
		t.Fatalf("the delta has %d ranges; the test needs several", len(all))
	}
	// Resumed from inside a range and from between two: rebuilt the same.
	for _, start := range []int64{all[1][0] + 1, all[0][0] + all[0][1] + 1, 4097} {
		checkDeltaRPC(t, in, sm, s1, s2, start)
	}
	// The snapshots are held while read, not changed: both still delete.
	for _, s := range []*csi.Snapshot{s1, s2, sb, sd} {
		_, err := in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s.GetSnapshotId()})
		csitest.MustCode(t, err, codes.OK, "DeleteSnapshot")
	}
}
