package engine

import (
	"bytes"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Changed block tracking of image files (the CSI SnapshotMetadata service):
// which ranges of a snapshot's image hold data, and which differ between two
// images of one volume, from the filesystem's extent maps (FIEMAP).
//
// Two images that share a physical extent at the same offset hold the same
// bytes there: btrfs and XFS never write a shared extent in place (a write
// to a reflinked block gets a new one). So where the images share, nothing
// changed; where one holds data and the other a hole or an unwritten extent
// (both read as zeros), or where their extents differ, the range is
// reported, without reading data. Images that share no extent at all (a
// data root without reflink, whose snapshots are copies) are compared
// byte by byte where their extents differ, so the answer stays small.
// Either way no changed block is ever left out: a range is skipped only
// when it is a hole in both images, on one shared extent, or read equal.

// ExtentStats counts what a range query read.
type ExtentStats struct {
	// BytesRead is how much image data was read to compare blocks (0 when
	// the extent maps answered alone).
	BytesRead int64
	// Compared says the images shared no extent and were compared by
	// reading where their extents differ.
	Compared bool
}

// Struct fiemap and its extents (linux/fiemap.h).
type fiemapHeader struct {
	Start, Length                     uint64
	Flags, MappedExtents, ExtentCount uint32
	_                                 uint32
}

type fiemapExtent struct {
	Logical, Physical, Length uint64
	_                         [2]uint64
	Flags                     uint32
	_                         [3]uint32
}

const (
	fsIocFiemap = 0xC020660B // _IOWR('f', 11, struct fiemap)
	fiemapSync  = 0x1        // FIEMAP_FLAG_SYNC: write back dirty data first

	extentLast      = 0x1
	extentUnknown   = 0x2
	extentDelalloc  = 0x4
	extentEncoded   = 0x8
	extentNotAlign  = 0x100
	extentInline    = 0x200
	extentTail      = 0x400
	extentUnwritten = 0x800
	extentShared    = 0x2000

	// extentOpaque: the physical address does not name the bytes alone.
	extentOpaque = extentUnknown | extentDelalloc | extentEncoded | extentNotAlign | extentInline | extentTail

	fiemapBatch = 512
)

// extent is one mapped range [off, end) of a file at physical address phys.
type extent struct {
	off, end, phys int64
	flags          uint32
}

func (e extent) data() bool { return e.flags&extentUnwritten == 0 }

// extents maps [start, end) of the file fd (FIEMAP, dirty data written
// back first), clipped to the range; unwritten extents are kept (flagged).
func extents(fd int, start, end int64) ([]extent, error) {
	buf := make([]byte, int(unsafe.Sizeof(fiemapHeader{}))+fiemapBatch*int(unsafe.Sizeof(fiemapExtent{})))
	hdr := (*fiemapHeader)(unsafe.Pointer(&buf[0]))
	exts := unsafe.Slice((*fiemapExtent)(unsafe.Pointer(&buf[unsafe.Sizeof(fiemapHeader{})])), fiemapBatch)
	var out []extent
	for pos := start; pos < end; {
		*hdr = fiemapHeader{Start: uint64(pos), Length: uint64(end - pos), Flags: fiemapSync, ExtentCount: fiemapBatch}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
			return nil, fmt.Errorf("FIEMAP: %w", e)
		}
		if hdr.MappedExtents == 0 {
			break
		}
		last := false
		for _, x := range exts[:hdr.MappedExtents] {
			e := extent{off: int64(x.Logical), end: int64(x.Logical + x.Length), phys: int64(x.Physical), flags: x.Flags}
			last = last || x.Flags&extentLast != 0
			if e.off < pos { // the extent the range starts in
				e.phys += pos - e.off
				e.off = pos
			}
			e.end = min(e.end, end)
			if e.off < e.end {
				out = append(out, e)
			}
			pos = max(pos, int64(x.Logical+x.Length))
		}
		if last {
			break
		}
	}
	return out, nil
}

// rangeEmitter aligns ranges to whole blocks, merges the adjacent ones and
// hands them on in ascending order.
type rangeEmitter struct {
	size       int64
	start, end int64 // pending range; end 0: none
	yield      func(off, n int64) error
}

func (r *rangeEmitter) add(off, end int64) error {
	off = off &^ (contract.BlockBytes - 1)
	end = min((end+contract.BlockBytes-1)&^(contract.BlockBytes-1), r.size)
	if off >= end {
		return nil
	}
	if r.end != 0 && off <= r.end {
		r.end = max(r.end, end)
		return nil
	}
	if err := r.flush(); err != nil {
		return err
	}
	r.start, r.end = off, end
	return nil
}

func (r *rangeEmitter) flush() error {
	if r.end == 0 {
		return nil
	}
	s, e := r.start, r.end
	r.end = 0
	return r.yield(s, e-s)
}

func openImage(path string) (int, int64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%s is not a regular file", path)
	}
	return fd, st.Size, nil
}

// AllocatedRanges calls yield with the ranges of the image file at path,
// from start (rounded down to a block) to its size, that hold data, in
// ascending order, whole blocks, adjacent ones merged. Holes and unwritten
// extents read as zeros and are left out.
func AllocatedRanges(path string, start int64, yield func(off, n int64) error) error {
	fd, size, err := openImage(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	start &^= contract.BlockBytes - 1
	exts, err := extents(fd, start, size)
	if err != nil {
		return fmt.Errorf("extents of %s: %w", path, err)
	}
	r := &rangeEmitter{size: size, yield: yield}
	for _, e := range exts {
		if !e.data() {
			continue
		}
		if err := r.add(e.off, e.end); err != nil {
			return err
		}
	}
	return r.flush()
}

// ChangedRanges calls yield with the ranges of the image file at path,
// from start (rounded down to a block) to its size, whose bytes may differ
// from those of the image at basePath (an earlier image of the same
// volume; past its end it reads as zeros), in ascending order, whole
// blocks, adjacent ones merged. It may report a range that reads the same
// (over-reporting); it never leaves out one that differs.
func ChangedRanges(path, basePath string, start int64, yield func(off, n int64) error) (ExtentStats, error) {
	var st ExtentStats
	fd, size, err := openImage(path)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	bfd, bsize, err := openImage(basePath)
	if err != nil {
		return st, err
	}
	defer unix.Close(bfd)
	start &^= contract.BlockBytes - 1
	texts, err := extents(fd, start, size)
	if err != nil {
		return st, fmt.Errorf("extents of %s: %w", path, err)
	}
	bexts, err := extents(bfd, start, min(bsize, size))
	if err != nil {
		return st, fmt.Errorf("extents of %s: %w", basePath, err)
	}
	st.Compared = true
	for _, e := range texts {
		if e.flags&extentShared != 0 {
			st.Compared = false
			break
		}
	}
	r := &rangeEmitter{size: size, yield: yield}
	c := &comparer{fd: fd, bfd: bfd, bsize: bsize, st: &st}
	// Walk the segments on which neither image's mapping changes.
	ti, bi := 0, 0
	for pos := start; pos < size; {
		for ti < len(texts) && texts[ti].end <= pos {
			ti++
		}
		for bi < len(bexts) && bexts[bi].end <= pos {
			bi++
		}
		next := size
		var t, b *extent
		if ti < len(texts) {
			if texts[ti].off <= pos {
				t = &texts[ti]
				next = min(next, t.end)
			} else {
				next = min(next, texts[ti].off)
			}
		}
		if bi < len(bexts) {
			if bexts[bi].off <= pos {
				b = &bexts[bi]
				next = min(next, b.end)
			} else {
				next = min(next, bexts[bi].off)
			}
		}
		tData, bData := t != nil && t.data(), b != nil && b.data()
		switch {
		case !tData && !bData:
			// Zeros in both.
		case tData && bData && sameBlocks(t, b, pos):
			// One shared extent.
		case st.Compared:
			if err := c.compare(pos, next, r); err != nil {
				return st, err
			}
		default:
			if err := r.add(pos, next); err != nil {
				return st, err
			}
		}
		pos = next
	}
	return st, r.flush()
}

// sameBlocks says whether extents t and b, both holding pos, map pos to
// one physical block whose address names its bytes.
func sameBlocks(t, b *extent, pos int64) bool {
	if t.flags&extentOpaque != 0 || b.flags&extentOpaque != 0 {
		return false
	}
	return t.phys+(pos-t.off) == b.phys+(pos-b.off)
}

// comparer reads two images block by block where their extents differ.
type comparer struct {
	fd, bfd int
	bsize   int64
	st      *ExtentStats
	a, b    []byte
}

const compareChunk = 1 << 20

func (c *comparer) compare(off, end int64, r *rangeEmitter) error {
	if c.a == nil {
		c.a, c.b = make([]byte, compareChunk), make([]byte, compareChunk)
	}
	off &^= contract.BlockBytes - 1
	for off < end {
		n := min(int64(compareChunk), end-off)
		a, b := c.a[:n], c.b[:n]
		if err := preadFull(c.fd, a, off); err != nil {
			return err
		}
		if off < c.bsize {
			if err := preadFull(c.bfd, b, off); err != nil {
				return err
			}
		} else {
			clear(b)
		}
		c.st.BytesRead += 2 * n
		for i := int64(0); i < n; i += contract.BlockBytes {
			j := min(i+contract.BlockBytes, n)
			if !bytes.Equal(a[i:j], b[i:j]) {
				if err := r.add(off+i, off+j); err != nil {
					return err
				}
			}
		}
		off += n
	}
	return nil
}
