package engine

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// A backup tool's view of the extent logic, on the filesystems data roots
// use: a "volume" image is snapshotted (a reflink where the filesystem has
// them, else a sparse copy: engine.CopyData, as snapshots are made), changed
// at random (whole blocks, partial ones, into holes, holes punched as a
// loop device's discard does, zero ranges, growth), snapshotted again; the
// ranges ChangedRanges names, copied from the new snapshot onto a copy of
// the old, must give the new one byte for byte; AllocatedRanges' ranges
// onto zeros likewise. The over-report is logged.
func TestChangedRangesRebuildTheSnapshot(t *testing.T) {
	for _, kind := range []string{testfs.Btrfs, testfs.XFSReflink, testfs.Ext4} {
		t.Run(kind, func(t *testing.T) {
			mnt := testfs.New(t, kind, 768<<20)
			r := rand.New(rand.NewSource(int64(len(kind))))
			vol := filepath.Join(mnt, "vol.img")
			size := int64(64 << 20)
			f, err := os.OpenFile(vol, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
				t.Fatal(err)
			}
			mutate(t, r, f, size, 40)
			prev := snapshotImage(t, f, filepath.Join(mnt, "s0.img"))
			checkAllocated(t, prev)
			for round := 1; round <= 6; round++ {
				if round == 4 { // the volume grows between two snapshots
					size += 8 << 20
					if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
						t.Fatal(err)
					}
				}
				changed := mutate(t, r, f, size, 1+r.Intn(60))
				next := snapshotImage(t, f, filepath.Join(mnt, fmt.Sprintf("s%d.img", round)))
				st, reported := checkDelta(t, prev, next)
				checkAllocated(t, next)
				t.Logf("round %d: %d blocks written, %d KiB differ, %d KiB reported, %d KiB read to compare (compared: %v)",
					round, changed, differing(t, prev, next)>>10, reported>>10, st.BytesRead>>10, st.Compared)
				if kind != testfs.Ext4 && (st.Compared || st.BytesRead != 0) {
					t.Errorf("round %d: %s has reflinks, yet the images were read (%d bytes)", round, kind, st.BytesRead)
				}
				prev = next
			}
		})
	}
}

// mutate makes n random changes to the image f of size bytes and returns
// how many blocks they touched.
func mutate(t *testing.T, r *rand.Rand, f *os.File, size int64, n int) int {
	t.Helper()
	blocks := size / contract.BlockBytes
	touched := 0
	for range n {
		off := r.Int63n(blocks) * contract.BlockBytes
		length := int64(1+r.Intn(64)) * contract.BlockBytes
		length = min(length, size-off)
		var err error
		switch r.Intn(6) {
		case 0, 1: // whole blocks
			b := make([]byte, length)
			r.Read(b)
			_, err = f.WriteAt(b, off)
		case 2: // part of one block
			b := make([]byte, 1+r.Intn(100))
			r.Read(b)
			_, err = f.WriteAt(b, off+int64(r.Intn(int(contract.BlockBytes)-len(b))))
			length = contract.BlockBytes
		case 3: // a discard: the loop device punches a hole
			err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
		case 4: // zeroes written as data
			_, err = f.WriteAt(make([]byte, length), off)
		case 5: // a write of the bytes already there: changes nothing
			b := make([]byte, length)
			if _, err = f.ReadAt(b, off); err == nil {
				_, err = f.WriteAt(b, off)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		touched += int(length / contract.BlockBytes)
	}
	return touched
}

// snapshotImage copies f to dst as snapshots are made and returns dst.
func snapshotImage(t *testing.T, f *os.File, dst string) string {
	t.Helper()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, _, err := CopyData(int(out.Fd()), int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	return dst
}

// collect gathers the ranges a query yields, checking they are whole
// blocks, ascending and apart.
func collect(t *testing.T, size int64) (*[][2]int64, func(off, n int64) error) {
	var out [][2]int64
	return &out, func(off, n int64) error {
		if n <= 0 || off%contract.BlockBytes != 0 || (n%contract.BlockBytes != 0 && off+n != size) || off+n > size {
			t.Errorf("range [%d, +%d) is not whole blocks within %d bytes", off, n, size)
		}
		if k := len(out); k > 0 && out[k-1][0]+out[k-1][1] >= off {
			t.Errorf("range [%d, +%d) is not after [%d, +%d) with a gap", off, n, out[k-1][0], out[k-1][1])
		}
		out = append(out, [2]int64{off, n})
		return nil
	}
}

// checkDelta rebuilds next from prev and the ranges ChangedRanges names,
// and returns the query's stats and the bytes reported.
func checkDelta(t *testing.T, prev, next string) (ExtentStats, int64) {
	t.Helper()
	want := readAll(t, next)
	got := readAll(t, prev)
	got = append(got, make([]byte, max(0, len(want)-len(got)))...)
	ranges, yield := collect(t, int64(len(want)))
	st, err := ChangedRanges(next, prev, 0, yield)
	if err != nil {
		t.Fatal(err)
	}
	var reported int64
	for _, rg := range *ranges {
		copy(got[rg[0]:rg[0]+rg[1]], want[rg[0]:rg[0]+rg[1]])
		reported += rg[1]
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s rebuilt from %s and the changed ranges differs from it at %d", next, prev, firstDiff(got, want))
	}
	// A resumed query (starting_offset inside the volume) names the same
	// ranges from there on.
	mid := int64(len(want)) / 3
	later, yield := collect(t, int64(len(want)))
	if _, err := ChangedRanges(next, prev, mid+5, yield); err != nil {
		t.Fatal(err)
	}
	for _, rg := range *later {
		if rg[0]+rg[1] <= mid {
			t.Errorf("resumed at %d: range [%d, +%d) ends before it", mid+5, rg[0], rg[1])
		}
		for i := max(rg[0], mid&^(contract.BlockBytes-1)); i < rg[0]+rg[1]; i += contract.BlockBytes {
			if !covered(*ranges, i) {
				t.Errorf("resumed at %d: block at %d named, not by the full query", mid+5, i)
			}
		}
	}
	for _, rg := range *ranges {
		for i := rg[0]; i < rg[0]+rg[1]; i += contract.BlockBytes {
			if i >= mid&^(contract.BlockBytes-1) && !covered(*later, i) {
				t.Fatalf("resumed at %d: block at %d left out", mid+5, i)
			}
		}
	}
	return st, reported
}

func covered(rs [][2]int64, off int64) bool {
	for _, r := range rs {
		if off >= r[0] && off < r[0]+r[1] {
			return true
		}
	}
	return false
}

// checkAllocated rebuilds img from zeros and the ranges AllocatedRanges names.
func checkAllocated(t *testing.T, img string) {
	t.Helper()
	want := readAll(t, img)
	got := make([]byte, len(want))
	ranges, yield := collect(t, int64(len(want)))
	if err := AllocatedRanges(img, 0, yield); err != nil {
		t.Fatal(err)
	}
	for _, rg := range *ranges {
		copy(got[rg[0]:rg[0]+rg[1]], want[rg[0]:rg[0]+rg[1]])
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s rebuilt from zeros and its allocated ranges differs at %d", img, firstDiff(got, want))
	}
}

// differing counts the bytes of the 4 KiB blocks that differ between a and b.
func differing(t *testing.T, a, b string) int64 {
	x, y := readAll(t, a), readAll(t, b)
	x = append(x, make([]byte, max(0, len(y)-len(x)))...)
	var n int64
	for i := 0; i < len(y); i += int(contract.BlockBytes) {
		j := min(i+int(contract.BlockBytes), len(y))
		if !bytes.Equal(x[i:j], y[i:j]) {
			n += int64(j - i)
		}
	}
	return n
}

func readAll(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A query on a file that is no image, or is missing, fails; nothing is named.
func TestRangesRefuseNonImages(t *testing.T) {
	dir := t.TempDir()
	if err := AllocatedRanges(dir, 0, func(int64, int64) error { return nil }); err == nil {
		t.Error("AllocatedRanges of a directory succeeded")
	}
	if _, err := ChangedRanges(filepath.Join(dir, "missing"), dir, 0, func(int64, int64) error { return nil }); err == nil {
		t.Error("ChangedRanges of a missing file succeeded")
	}
}
