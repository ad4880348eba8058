package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// Incremental image streams: an image file sent as its difference from a
// base image the receiver holds too (an earlier snapshot of the same
// volume): the zeroBlock-sized blocks that differ, as data, or as opZero
// where the new image reads zeros. The receiver applies them to a copy (a
// reflink where the filesystem can) of its base, then checks imageSum of
// the result against the sender's: the new image is accepted only when it
// is, block for block, the one the sender read — whatever the base held.

// StreamFileDelta is an image file sent as its difference from a base.
const StreamFileDelta StreamKind = "filedelta"

// opZero: Size bytes at Off of the current file read as zeros.
const opZero byte = 'h'

// SendFileDelta writes the stream of the image file at path as its
// difference from the image at basePath. Both are read in full where
// either holds data; only what differs crosses.
func SendFileDelta(path, basePath string, w io.Writer) (StreamStats, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return StreamStats{}, err
	}
	defer unix.Close(fd)
	bfd, err := unix.Open(basePath, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return StreamStats{}, err
	}
	defer unix.Close(bfd)
	var st, bst unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return StreamStats{}, err
	}
	if err := unix.Fstat(bfd, &bst); err != nil {
		return StreamStats{}, err
	}
	s := newSender(w)
	if err := s.enc.Encode(&streamHeader{Version: streamVersion, Kind: StreamFileDelta, Bytes: st.Blocks * 512}); err != nil {
		return s.st, err
	}
	if err := s.send(&record{Op: opFile, Size: st.Size}); err != nil {
		return s.st, err
	}
	sum := newImageSum()
	base := make([]byte, chunk)
	for off := int64(0); off < st.Size; {
		next, err := nextData(fd, off, st.Size)
		if err != nil {
			return s.st, err
		}
		if off < bst.Size {
			bnext, err := nextData(bfd, off, bst.Size)
			if err != nil {
				return s.st, err
			}
			if bnext < bst.Size {
				next = min(next, bnext)
			}
		}
		if next >= st.Size {
			break
		}
		off = next / zeroBlock * zeroBlock
		n := min(int64(chunk), st.Size-off)
		cur := s.buf[:n]
		if err := preadFull(fd, cur, off); err != nil {
			return s.st, fmt.Errorf("read %s: %w", path, err)
		}
		clear(base[:n])
		if off < bst.Size {
			if err := preadFull(bfd, base[:min(n, bst.Size-off)], off); err != nil {
				return s.st, fmt.Errorf("read %s: %w", basePath, err)
			}
		}
		if err := s.sendDiff(off, cur, base[:n], sum); err != nil {
			return s.st, err
		}
		off += n
	}
	s.st.Sum = s.h.Sum(nil)
	if err := s.enc.Encode(&record{Op: opDone, Sum: s.st.Sum, Image: sum.Sum(nil)}); err != nil {
		return s.st, err
	}
	return s.st, s.bw.Flush()
}

// sendDiff sends the blocks of cur (read at off) that differ from base:
// runs of data, or of zeros. sum gets cur's non-zero blocks.
func (s *sender) sendDiff(off int64, cur, base []byte, sum *imageSum) error {
	run, zero := -1, false
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		var err error
		if zero {
			err = s.send(&record{Op: opZero, Off: off + int64(run), Size: int64(end - run)})
		} else {
			err = s.send(&record{Op: opData, Off: off + int64(run), data: cur[run:end]})
			s.st.Bytes += int64(end - run)
		}
		run = -1
		return err
	}
	for i := 0; i < len(cur); i += zeroBlock {
		end := min(i+zeroBlock, len(cur))
		isZero := bytes.Equal(cur[i:end], zeros[:end-i])
		if !isZero {
			sum.add(off+int64(i), cur[i:end])
		}
		if bytes.Equal(cur[i:end], base[i:end]) {
			if err := flush(i); err != nil {
				return err
			}
			continue
		}
		if run >= 0 && zero != isZero {
			if err := flush(i); err != nil {
				return err
			}
		}
		if run < 0 {
			run, zero = i, isZero
		}
	}
	return flush(len(cur))
}

// ReceiveImage is Receive of an image stream into the new file dst: a
// whole image (StreamFile), or one sent as its difference from basePath
// (StreamFileDelta; basePath "" refuses one), applied to a copy of it.
func ReceiveImage(r io.Reader, dst, basePath string, limit int64, progress func(done, total int64)) (StreamStats, error) {
	rc, hd, err := newReceiver(r, limit, progress)
	if err != nil {
		return rc.st, err
	}
	defer rc.closeAll()
	switch {
	case hd.Kind == StreamFile:
		return rc.st, rc.image(dst, "")
	case hd.Kind == StreamFileDelta && basePath != "":
		return rc.st, rc.image(dst, basePath)
	}
	return rc.st, fmt.Errorf("the stream holds %q, want an image", hd.Kind)
}

// zero applies an opZero record: its range of the current file reads as
// zeros (a hole punched, after the pending writes).
func (rc *receiver) zero(r *record) error {
	if r.Off < 0 || r.Size <= 0 || r.Off+r.Size > rc.cur.size {
		return fmt.Errorf("zeros at %d+%d are outside the file's %d bytes", r.Off, r.Size, rc.cur.size)
	}
	if err := rc.w.drain(); err != nil {
		return err
	}
	if err := unix.Fallocate(rc.cur.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r.Off, r.Size); err != nil {
		return fmt.Errorf("zero %d bytes at %d: %w", r.Size, r.Off, err)
	}
	return nil
}

// imageSum is the XXH64 of an image's content: of each non-zero
// zeroBlock-aligned block, its offset and bytes, in order. Holes and
// blocks of zeros count as nothing, so two files that read the same have
// the same sum however they are allocated.
type imageSum struct{ h *xxhash.Digest }

func newImageSum() *imageSum { return &imageSum{xxhash.New()} }

func (s *imageSum) add(off int64, b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(off))
	s.h.Write(n[:])
	s.h.Write(b)
}

func (s *imageSum) Sum(b []byte) []byte { return s.h.Sum(b) }

// fileImageSum is the imageSum of fd's first size bytes.
func fileImageSum(fd int, size int64) ([]byte, error) {
	sum := newImageSum()
	buf := make([]byte, chunk)
	for off := int64(0); off < size; {
		next, err := nextData(fd, off, size)
		if err != nil {
			return nil, err
		}
		if next >= size {
			break
		}
		off = next / zeroBlock * zeroBlock
		n := min(int64(chunk), size-off)
		if err := preadFull(fd, buf[:n], off); err != nil {
			return nil, err
		}
		for i := int64(0); i < n; i += zeroBlock {
			end := min(i+zeroBlock, n)
			if !bytes.Equal(buf[i:end], zeros[:end-i]) {
				sum.add(off+i, buf[i:end])
			}
		}
		off += n
	}
	return sum.Sum(nil), nil
}

// nextData is the offset of fd's next data at or after off (SEEK_DATA),
// or size when only a hole is left.
func nextData(fd int, off, size int64) (int64, error) {
	d, err := unix.Seek(fd, off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return size, nil
	}
	return d, err
}

// preadFull fills b from fd at off; past the end of the file it reads zeros.
func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := unix.Pread(fd, b, off)
		if err != nil {
			return err
		}
		if n == 0 {
			clear(b)
			return nil
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
