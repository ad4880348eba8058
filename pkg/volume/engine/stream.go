package engine

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash"
	"io"
	"path/filepath"
	"strings"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// The node-to-node stream: a gob stream of one streamHeader, then records,
// then a final record carrying the XXH64 checksum of every record before it
// (digest: the same fields hashed the same way on both sides), so the
// receiver accepts data only when what it applied is what the sender read.
// A data record is followed by its Len bytes of data, raw, outside gob: the
// bytes are copied once on each side. The checksum guards against what TLS
// does not see (a wrong offset, a short read, a bug on either side), not
// against an attacker, which TLS's authenticated encryption does: a fast
// 64-bit checksum, not a slow cryptographic digest.
// A tree is sent as CopyTree copies it (types, modes, owners, nanosecond
// times, xattrs with ACLs, symlinks, hard links, device nodes, FIFOs); the
// data of regular files and of an image file as their data segments only
// (SEEK_DATA/SEEK_HOLE), so holes cost nothing on the wire and stay holes.

// StreamKind is what a stream holds.
type StreamKind string

const (
	// StreamTree is a directory volume or snapshot.
	StreamTree StreamKind = "tree"
	// StreamFile is an image file (an image or raw block volume).
	StreamFile StreamKind = "file"
)

const streamVersion = 2

// chunk is the most data one record carries.
const chunk = 1 << 20

type streamHeader struct {
	Version int
	Kind    StreamKind
	// Bytes is about how much data follows (allocated bytes), for progress.
	Bytes int64
}

// Record ops.
const (
	opDir     byte = 'd' // enter subdirectory Name (created)
	opEnd     byte = 'e' // the current directory's attributes; leave it
	opFile    byte = 'f' // regular file Name of Size bytes; its opData follow
	opData    byte = 'x' // Len bytes at Off of the current file; the bytes follow the record
	opSymlink byte = 's' // symlink Name → Target
	opLink    byte = 'l' // hard link Name to the earlier file Target (path from the root)
	opSpecial byte = 'n' // device node, FIFO or socket Name
	opDone    byte = 'z' // end; Sum is the digest of everything before
)

type xattr struct {
	Name  string
	Value []byte
}

type record struct {
	Op           byte
	Name, Target string
	Mode         uint32
	Uid, Gid     uint32
	Rdev         uint64
	Size, Off    int64
	Len          int64
	Atime, Mtime int64 // Unix nanoseconds
	Xattrs       []xattr
	Sum          []byte
	// Image is, on the opDone record of a StreamFileDelta, the imageSum
	// of the image sent.
	Image []byte
	// data is an opData record's data, sent after it (gob leaves unexported
	// fields out).
	data []byte
}

// digest adds r to h: every field but Sum, length-prefixed, then the data.
func digest(h hash.Hash, r *record) {
	var b [8]byte
	num := func(v uint64) { binary.LittleEndian.PutUint64(b[:], v); h.Write(b[:]) }
	str := func(s []byte) { num(uint64(len(s))); h.Write(s) }
	h.Write([]byte{r.Op})
	str([]byte(r.Name))
	str([]byte(r.Target))
	for _, v := range []uint64{uint64(r.Mode), uint64(r.Uid), uint64(r.Gid), r.Rdev, uint64(r.Size), uint64(r.Off), uint64(r.Len), uint64(r.Atime), uint64(r.Mtime), uint64(len(r.Xattrs))} {
		num(v)
	}
	for _, x := range r.Xattrs {
		str([]byte(x.Name))
		str(x.Value)
	}
	h.Write(r.data)
}

// StreamStats says what a stream carried.
type StreamStats struct {
	Entries int
	// Bytes is the file data carried (holes excluded).
	Bytes int64
	// Sum is the XXH64 checksum both sides computed.
	Sum []byte
}

type sender struct {
	bw    *bufio.Writer
	enc   *gob.Encoder
	h     hash.Hash
	st    StreamStats
	buf   []byte
	links map[uint64]string
	dev   uint64
}

func newSender(w io.Writer) *sender {
	bw := bufio.NewWriterSize(w, 256<<10)
	return &sender{bw: bw, enc: gob.NewEncoder(bw), h: xxhash.New(), buf: make([]byte, chunk), links: map[uint64]string{}}
}

func (s *sender) send(r *record) error {
	r.Len = int64(len(r.data))
	digest(s.h, r)
	s.st.Entries++
	if err := s.enc.Encode(r); err != nil {
		return err
	}
	_, err := s.bw.Write(r.data)
	return err
}

func (s *sender) finish() (StreamStats, error) {
	s.st.Sum = s.h.Sum(nil)
	if err := s.enc.Encode(&record{Op: opDone, Sum: s.st.Sum}); err != nil {
		return s.st, err
	}
	return s.st, s.bw.Flush()
}

// SendFile writes the stream of the image file at path to w.
func SendFile(path string, w io.Writer) (StreamStats, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return StreamStats{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return StreamStats{}, err
	}
	s := newSender(w)
	if err := s.enc.Encode(&streamHeader{Version: streamVersion, Kind: StreamFile, Bytes: st.Blocks * 512}); err != nil {
		return s.st, err
	}
	if err := s.send(&record{Op: opFile, Size: st.Size}); err != nil {
		return s.st, err
	}
	if err := s.data(fd, st.Size); err != nil {
		return s.st, fmt.Errorf("read %s: %w", path, err)
	}
	return s.finish()
}

// SendTree writes the stream of the directory tree at src (which must not
// change meanwhile: a snapshot, or a private copy) to w. Other filesystems
// below src are sent empty, as CopyTree copies them.
func SendTree(src string, w io.Writer) (StreamStats, error) {
	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return StreamStats{}, fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(fd)
	var root unix.Stat_t
	if err := unix.Fstat(fd, &root); err != nil {
		return StreamStats{}, err
	}
	used, _, err := DiskUsage(src)
	if err != nil {
		return StreamStats{}, err
	}
	s := newSender(w)
	s.dev = root.Dev
	if err := s.enc.Encode(&streamHeader{Version: streamVersion, Kind: StreamTree, Bytes: used}); err != nil {
		return s.st, err
	}
	if err := s.dir(fd, ""); err != nil {
		return s.st, err
	}
	if err := s.end(fd, &root); err != nil {
		return s.st, err
	}
	return s.finish()
}

func (s *sender) dir(fd int, rel string) error {
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("read %s: %w", rel, err)
	}
	for _, name := range names {
		if err := s.entry(fd, name, filepath.Join(rel, name)); err != nil {
			return err
		}
	}
	return nil
}

// attrs fills r's owner, mode and times from st and its xattrs from x.
func attrs(r *record, st *unix.Stat_t, x xattrIO) error {
	r.Mode, r.Uid, r.Gid, r.Rdev = st.Mode, st.Uid, st.Gid, st.Rdev
	r.Atime, r.Mtime = st.Atim.Nano(), st.Mtim.Nano()
	xs, err := readXattrs(x)
	for _, a := range xs {
		// XFS's own names of the POSIX ACLs sent as system.posix_acl_*:
		// on another filesystem they would be stray trusted xattrs.
		if a.Name != "trusted.SGI_ACL_FILE" && a.Name != "trusted.SGI_ACL_DEFAULT" {
			r.Xattrs = append(r.Xattrs, a)
		}
	}
	return err
}

func (s *sender) end(fd int, st *unix.Stat_t) error {
	r := &record{Op: opEnd}
	if err := attrs(r, st, fdXattr(fd)); err != nil {
		return err
	}
	return s.send(r)
}

func (s *sender) entry(dfd int, name, rel string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
		if first, ok := s.links[st.Ino]; ok {
			return s.send(&record{Op: opLink, Name: name, Target: first})
		}
		s.links[st.Ino] = rel
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", rel, err)
		}
		defer unix.Close(fd)
		if err := s.send(&record{Op: opDir, Name: name}); err != nil {
			return err
		}
		if st.Dev == s.dev {
			if err := s.dir(fd, rel); err != nil {
				return err
			}
		}
		return s.end(fd, &st)
	case unix.S_IFREG:
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", rel, err)
		}
		defer unix.Close(fd)
		r := &record{Op: opFile, Name: name, Size: st.Size}
		if err := attrs(r, &st, fdXattr(fd)); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		if err := s.send(r); err != nil {
			return err
		}
		if err := s.data(fd, st.Size); err != nil {
			return fmt.Errorf("read %s: %w", rel, err)
		}
		return nil
	case unix.S_IFLNK:
		target, err := readlinkat(dfd, name)
		if err != nil {
			return fmt.Errorf("readlink %s: %w", rel, err)
		}
		r := &record{Op: opSymlink, Name: name, Target: target}
		if err := attrs(r, &st, pathXattr(fdPath(dfd)+"/"+name)); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return s.send(r)
	default:
		r := &record{Op: opSpecial, Name: name}
		if err := attrs(r, &st, pathXattr(fdPath(dfd)+"/"+name)); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		return s.send(r)
	}
}

// data sends the data segments of fd (size bytes long) in chunks.
func (s *sender) data(fd int, size int64) error {
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for start < end {
			n, err := unix.Pread(fd, s.buf[:min(int64(len(s.buf)), end-start)], start)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("the file shrank during the transfer")
			}
			if err := s.sendNonZero(start, s.buf[:n]); err != nil {
				return err
			}
			start += int64(n)
		}
		off = end
	}
	return nil
}

// zeroBlock is the unit sendNonZero skips when it holds only zeros.
const zeroBlock = 64 << 10

var zeros = make([]byte, zeroBlock)

// sendNonZero sends the data b read at off, leaving out the zeroBlock-sized
// blocks that hold only zeros: the receiver's file reads zeros there (a
// hole), and an image's preallocated but never written extents — which
// SEEK_DATA reports as data on btrfs and XFS — cost nothing on the wire.
func (s *sender) sendNonZero(off int64, b []byte) error {
	run := -1 // start of the current run of non-zero blocks
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		err := s.send(&record{Op: opData, Off: off + int64(run), data: b[run:end]})
		s.st.Bytes += int64(end - run)
		run = -1
		return err
	}
	for i := 0; i < len(b); i += zeroBlock {
		end := min(i+zeroBlock, len(b))
		if bytes.Equal(b[i:end], zeros[:end-i]) {
			if err := flush(i); err != nil {
				return err
			}
		} else if run < 0 {
			run = i
		}
	}
	return flush(len(b))
}

// Receive applies the stream r at dst: for StreamFile a new file of at most
// limit bytes (dst must not exist), for StreamTree into the existing empty
// directory dst. want is the kind the caller expects; progress, when set, is
// told the data bytes applied so far and the sender's estimate of the total.
// It fails (dst partly written: the caller removes it) on anything the
// stream should not hold: an unknown op, a name with a slash, a hard link
// to a file it did not create, data outside its file, or a digest that
// differs from what was applied.
func Receive(r io.Reader, dst string, want StreamKind, limit int64, progress func(done, total int64)) (StreamStats, error) {
	rc, hd, err := newReceiver(r, limit, progress)
	if err != nil {
		return rc.st, err
	}
	defer rc.closeAll()
	if hd.Kind != want {
		return rc.st, fmt.Errorf("the stream holds %q, want %q", hd.Kind, want)
	}
	if want == StreamFile {
		err = rc.image(dst, "")
	} else {
		err = rc.tree(dst)
	}
	if err != nil {
		return rc.st, err
	}
	return rc.st, nil
}

// newReceiver reads the stream's header; the receiver's writer runs until
// closeAll.
func newReceiver(r io.Reader, limit int64, progress func(done, total int64)) (*receiver, streamHeader, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	rc := &receiver{br: br, dec: gob.NewDecoder(br), h: xxhash.New(), limit: limit, made: map[string]bool{}, progress: progress}
	var hd streamHeader
	if err := rc.dec.Decode(&hd); err != nil {
		return rc, hd, fmt.Errorf("read the stream's header: %w", err)
	}
	if hd.Version != streamVersion {
		return rc, hd, fmt.Errorf("the stream is of version %d, want %d", hd.Version, streamVersion)
	}
	rc.total = hd.Bytes
	rc.w = newWriter()
	return rc, hd, nil
}

type receiver struct {
	br       *bufio.Reader // under dec: a data record's bytes are read from it
	dec      *gob.Decoder
	h        hash.Hash
	st       StreamStats
	limit    int64
	total    int64
	root     string
	dirs     []recvDir
	made     map[string]bool // non-directories created, by path from the root: hard link targets
	cur      *openFile
	progress func(done, total int64)
	rec      record
	w        *writer
}

type recvDir struct {
	fd  int
	rel string
}

// next decodes the next record into rc's one record (every field cleared
// first, as gob leaves the fields a record does not carry as they were) and
// reads the data that follows a data record into one reused buffer: the
// gob decoder reads exactly one message from br, so what follows it is the
// data.
func (rc *receiver) next() (*record, error) {
	r := &rc.rec
	*r = record{}
	broke := func(err error) (*record, error) {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("the stream broke off: %w", err)
	}
	if err := rc.dec.Decode(r); err != nil {
		return broke(err)
	}
	if r.Len != 0 && (r.Op != opData || r.Len < 0 || r.Len > chunk) {
		return nil, fmt.Errorf("a record of op %q carries %d bytes", r.Op, r.Len)
	}
	if r.Len > 0 {
		b, err := rc.w.buffer()
		if err != nil {
			return nil, err
		}
		r.data = b[:r.Len]
		if _, err := io.ReadFull(rc.br, r.data); err != nil {
			rc.w.giveBack(b)
			return broke(err)
		}
	}
	if r.Op != opDone {
		digest(rc.h, r)
		rc.st.Entries++
	}
	return r, nil
}

// done checks the final record's digest against what was applied.
func (rc *receiver) done(r *record) error {
	rc.st.Sum = rc.h.Sum(nil)
	if !bytes.Equal(r.Sum, rc.st.Sum) {
		return fmt.Errorf("checksum mismatch: the sender read %x, this node applied %x", r.Sum, rc.st.Sum)
	}
	return nil
}

// image receives an image into the new file dst: a whole one, or, with
// basePath, one sent as its difference from that image (StreamFileDelta),
// applied to a copy of it and checked against the sender's imageSum.
func (rc *receiver) image(dst, basePath string) error {
	r, err := rc.next()
	if err != nil {
		return err
	}
	if r.Op != opFile || r.Name != "" || r.Size < 0 || r.Size > rc.limit {
		return fmt.Errorf("the stream's image is %d bytes, the volume has %d (op %q)", r.Size, rc.limit, r.Op)
	}
	var fd int
	if basePath == "" {
		if fd, err = unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err != nil {
			return err
		}
		rc.cur = &openFile{fd: fd, size: r.Size}
	} else {
		in, err := unix.Open(basePath, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		if fd, err = unix.Open(dst, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err != nil {
			return err
		}
		rc.cur = &openFile{fd: fd, size: r.Size}
		if _, _, err := CopyData(fd, in); err != nil {
			return fmt.Errorf("copy the base image %s: %w", basePath, err)
		}
	}
	for {
		r, err := rc.next()
		if err != nil {
			return err
		}
		switch {
		case r.Op == opData:
			if err := rc.data(r); err != nil {
				return err
			}
		case r.Op == opZero && basePath != "":
			if err := rc.zero(r); err != nil {
				return err
			}
		case r.Op == opDone:
			if err := rc.w.drain(); err != nil {
				return err
			}
			if err := rc.done(r); err != nil {
				return err
			}
			// The size is set last: on ext4 a write into a hole below the
			// file's size costs several times an append.
			if err := unix.Ftruncate(fd, rc.cur.size); err != nil || basePath == "" {
				return err
			}
			got, err := fileImageSum(fd, rc.cur.size)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, r.Image) {
				return fmt.Errorf("image checksum mismatch: the sender's image is %x, the base with the changes applied %x", r.Image, got)
			}
			return nil
		default:
			return fmt.Errorf("an image stream holds op %q", r.Op)
		}
	}
}

func (rc *receiver) data(r *record) error {
	f := rc.cur
	if f == nil {
		return errors.New("data outside a file")
	}
	if r.Off < 0 || r.Off+int64(len(r.data)) > f.size {
		return fmt.Errorf("data at %d+%d is outside the file's %d bytes", r.Off, len(r.data), f.size)
	}
	if err := rc.w.write(f, r.data, r.Off); err != nil {
		return err
	}
	rc.st.Bytes += int64(len(r.data))
	if rc.progress != nil {
		rc.progress(rc.st.Bytes, rc.total)
	}
	return nil
}

func (rc *receiver) tree(dst string) error {
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	rc.root = dst
	rc.dirs = []recvDir{{fd: fd}}
	for {
		r, err := rc.next()
		if err != nil {
			return err
		}
		if r.Op != opData {
			if err := rc.closeFile(); err != nil {
				return err
			}
		}
		if r.Op == opDone {
			if len(rc.dirs) != 0 {
				return errors.New("the stream ended inside a directory")
			}
			return rc.done(r)
		}
		if len(rc.dirs) == 0 {
			return fmt.Errorf("op %q after the root's end", r.Op)
		}
		if err := rc.apply(r); err != nil {
			return err
		}
	}
}

// validName refuses what is not one path component.
func validName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\x00")
}

func (rc *receiver) apply(r *record) error {
	cur := rc.dirs[len(rc.dirs)-1]
	if r.Op == opData {
		return rc.data(r)
	}
	if r.Op == opEnd {
		rc.dirs = rc.dirs[:len(rc.dirs)-1]
		defer unix.Close(cur.fd)
		return setAttrsFd(cur.fd, r)
	}
	if !validName(r.Name) {
		return fmt.Errorf("the stream names an entry %q in %q", r.Name, cur.rel)
	}
	rel := filepath.Join(cur.rel, r.Name)
	switch r.Op {
	case opDir:
		if err := unix.Mkdirat(cur.fd, r.Name, 0o700); err != nil {
			return fmt.Errorf("mkdir %s: %w", rel, err)
		}
		fd, err := unix.Openat(cur.fd, r.Name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		rc.dirs = append(rc.dirs, recvDir{fd: fd, rel: rel})
		return nil
	case opFile:
		if r.Size < 0 {
			return fmt.Errorf("file %s of %d bytes", rel, r.Size)
		}
		fd, err := unix.Openat(cur.fd, r.Name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", rel, err)
		}
		attrs := *r
		attrs.data = nil // the receiver's buffer, reused by the next record
		rc.cur = &openFile{fd: fd, size: r.Size, r: attrs}
		rc.made[rel] = true
		return nil
	case opLink:
		if !rc.made[filepath.Clean(r.Target)] {
			return fmt.Errorf("hard link %s to %q, which the stream did not create", rel, r.Target)
		}
		if err := unix.Linkat(unix.AT_FDCWD, filepath.Join(rc.root, r.Target), cur.fd, r.Name, 0); err != nil {
			return fmt.Errorf("link %s: %w", rel, err)
		}
		return nil
	case opSymlink:
		if err := unix.Symlinkat(r.Target, cur.fd, r.Name); err != nil {
			return fmt.Errorf("symlink %s: %w", rel, err)
		}
		rc.made[rel] = true
		return setAttrsAt(cur.fd, r.Name, r)
	case opSpecial:
		if t := r.Mode & unix.S_IFMT; t != unix.S_IFCHR && t != unix.S_IFBLK && t != unix.S_IFIFO && t != unix.S_IFSOCK {
			return fmt.Errorf("special file %s of mode %o", rel, r.Mode)
		}
		if err := unix.Mknodat(cur.fd, r.Name, r.Mode&unix.S_IFMT|0o600, int(r.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", rel, err)
		}
		rc.made[rel] = true
		return setAttrsAt(cur.fd, r.Name, r)
	}
	return fmt.Errorf("unknown op %q", r.Op)
}

// closeFile gives the file being written its attributes and closes it.
func (rc *receiver) closeFile() error {
	f := rc.cur
	if f == nil {
		return nil
	}
	rc.cur = nil
	defer f.close()
	if err := rc.w.drain(); err != nil {
		return err
	}
	// The size is set last: on ext4 a write into a hole below the file's
	// size costs several times an append.
	if err := unix.Ftruncate(f.fd, f.size); err != nil {
		return err
	}
	return setAttrsFd(f.fd, &f.r)
}

func (rc *receiver) closeAll() {
	rc.w.stop()
	if rc.cur != nil {
		rc.cur.close()
		rc.cur = nil
	}
	for _, d := range rc.dirs {
		unix.Close(d.fd)
	}
	rc.dirs = nil
}

func times(r *record) []unix.Timespec {
	return []unix.Timespec{unix.NsecToTimespec(r.Atime), unix.NsecToTimespec(r.Mtime)}
}

// setAttrsFd gives fd r's owner, mode, xattrs and times, in the order
// attrsFd uses.
func setAttrsFd(fd int, r *record) error {
	if err := unix.Fchown(fd, int(r.Uid), int(r.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, r.Mode&0o7777); err != nil {
		return err
	}
	if err := writeXattrs(fdXattr(fd), r.Xattrs); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fdPath(fd), times(r), 0)
}

// setAttrsAt is setAttrsFd for entry name of dfd, never following it.
func setAttrsAt(dfd int, name string, r *record) error {
	if err := unix.Fchownat(dfd, name, int(r.Uid), int(r.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if r.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, r.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	if err := writeXattrs(pathXattr(fdPath(dfd)+"/"+name), r.Xattrs); err != nil {
		return err
	}
	return unix.UtimesNanoAt(dfd, name, times(r), unix.AT_SYMLINK_NOFOLLOW)
}
