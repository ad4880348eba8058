package state

// The write-ahead log. A bbolt commit costs two fdatasyncs (data pages, then
// the meta page), and a CreateVolume+DeleteVolume pair two commits, so on a
// disk that takes 1.5 ms per flush the state alone limited a CO to about 160
// pairs a second. Instead, each group of updates is now made durable with one
// checksummed record in the log and one fdatasync, and the changes are
// carried into the bbolt file later, many groups per bbolt commit
// ("checkpoint"): when the log or the changes held in memory grow large, and
// on Close. Until then reads see them through an in-memory layer over the
// bbolt file. Open replays what the log holds beyond the bbolt file, so an
// acknowledged change survives a crash either way.
//
// The log (<state file>-wal) is a preallocated file of zeros that records
// overwrite from the start after every checkpoint; writing inside allocated,
// initialized blocks makes fdatasync a plain flush without a filesystem
// journal commit. Each record is padded to 4 KiB, so writing one never
// rewrites a block holding an earlier, acknowledged one. A record is
//
//	magic u32 | crc32c u32 | payload length u32 | seq u64 | state id [16] | payload
//
// with the CRC over everything after it. seq numbers every group, across
// checkpoints; the bbolt file stores the last seq it contains (meta "walseq")
// and a random id (meta "walid") that ties a log to its state file. Reading
// stops at the first record that is damaged (a torn write: its group was
// never acknowledged) or does not continue the sequence (an older record,
// left from before the last checkpoint).
//
// A clean Close carries everything into the bbolt file and empties the log,
// so a stopped driver's state file alone holds the whole state (it can be
// copied or restored alone). A copy of the state file taken while the driver
// runs, or after a crash, lacks what is only in the log. If the log holds
// records of another state file, or changes that do not continue the state
// file's (it was restored from an older backup), Open refuses to start
// instead of guessing. When an fdatasync of the log fails, the store refuses
// every later change until a restart has read back what is on disk.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"

	bolt "go.etcd.io/bbolt"
)

const (
	walMagic    uint32 = 0x6c44574c // "LWDl"
	walHeader          = 36
	walBlock           = 4096
	walPrealloc        = 8 << 20
	// maxPending is the number of changed keys held in memory before a
	// checkpoint carries them into the bbolt file.
	maxPending = 1024
)

var (
	keyWALSeq = []byte("walseq")
	keyWALID  = []byte("walid")
	crcTable  = crc32.MakeTable(crc32.Castagnoli)
)

// WALPath is the write-ahead log of the state file at path.
func WALPath(path string) string { return path + "-wal" }

// entry is one changed key: its new value, or deleted.
type entry struct {
	val []byte
	del bool
}

// layer is a set of changes by bucket and key.
type layer struct {
	b map[string]map[string]entry
	n int // keys held
}

func newLayer() *layer { return &layer{b: map[string]map[string]entry{}} }

func (l *layer) get(bucket []byte, key string) (entry, bool) {
	e, ok := l.b[string(bucket)][key]
	return e, ok
}

func (l *layer) set(bucket, key string, e entry) {
	m := l.b[bucket]
	if m == nil {
		m = map[string]entry{}
		l.b[bucket] = m
	}
	if _, ok := m[key]; !ok {
		l.n++
	}
	m[key] = e
}

func (l *layer) merge(o *layer) {
	for b, m := range o.b {
		for k, e := range m {
			l.set(b, k, e)
		}
	}
}

// apply writes the changes into a bbolt transaction.
func (l *layer) apply(tx *bolt.Tx) error {
	for name, m := range l.b {
		b := tx.Bucket([]byte(name))
		if b == nil {
			return fmt.Errorf("no bucket %q", name)
		}
		for k, e := range m {
			var err error
			if e.del {
				err = b.Delete([]byte(k))
			} else {
				err = b.Put([]byte(k), e.val)
			}
			if err != nil {
				return fmt.Errorf("bucket %q key %q: %w", name, k, err)
			}
		}
	}
	return nil
}

const (
	opPut byte = 1
	opDel byte = 2
)

// encode serializes the layer (sorted, so equal layers encode equally).
func (l *layer) encode() []byte {
	var buf []byte
	names := make([]string, 0, len(l.b))
	for name := range l.b {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		keys := make([]string, 0, len(l.b[name]))
		for k := range l.b[name] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			e := l.b[name][k]
			op := opPut
			if e.del {
				op = opDel
			}
			buf = append(buf, op)
			buf = binary.AppendUvarint(buf, uint64(len(name)))
			buf = append(buf, name...)
			buf = binary.AppendUvarint(buf, uint64(len(k)))
			buf = append(buf, k...)
			if !e.del {
				buf = binary.AppendUvarint(buf, uint64(len(e.val)))
				buf = append(buf, e.val...)
			}
		}
	}
	return buf
}

func decodeLayer(p []byte) (*layer, error) {
	l := newLayer()
	bad := errors.New("malformed record")
	str := func() ([]byte, bool) {
		n, w := binary.Uvarint(p)
		if w <= 0 || n > uint64(len(p)-w) {
			return nil, false
		}
		s := p[w : w+int(n)]
		p = p[w+int(n):]
		return s, true
	}
	for len(p) > 0 {
		op := p[0]
		p = p[1:]
		name, ok1 := str()
		key, ok2 := str()
		if !ok1 || !ok2 {
			return nil, bad
		}
		switch op {
		case opDel:
			l.set(string(name), string(key), entry{del: true})
		case opPut:
			val, ok := str()
			if !ok {
				return nil, bad
			}
			l.set(string(name), string(key), entry{val: bytes.Clone(val)})
		default:
			return nil, bad
		}
	}
	return l, nil
}

func encodeRecord(seq uint64, id []byte, payload []byte) []byte {
	n := walHeader + len(payload)
	buf := make([]byte, (n+walBlock-1)/walBlock*walBlock)
	binary.LittleEndian.PutUint32(buf[0:], walMagic)
	binary.LittleEndian.PutUint32(buf[8:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(buf[12:], seq)
	copy(buf[20:walHeader], id)
	copy(buf[walHeader:], payload)
	binary.LittleEndian.PutUint32(buf[4:], crc32.Checksum(buf[8:n], crcTable))
	return buf
}

type walRecord struct {
	seq     uint64
	id      []byte
	payload []byte
}

// scanRecords returns the intact records at the start of data, in file
// order, up to the first block that does not hold one.
func scanRecords(data []byte) []walRecord {
	var out []walRecord
	for off := 0; off+walHeader <= len(data); {
		h := data[off:]
		if binary.LittleEndian.Uint32(h[0:]) != walMagic {
			break
		}
		n := int(binary.LittleEndian.Uint32(h[8:]))
		if n > len(h)-walHeader || binary.LittleEndian.Uint32(h[4:]) != crc32.Checksum(h[8:walHeader+n], crcTable) {
			break
		}
		out = append(out, walRecord{
			seq:     binary.LittleEndian.Uint64(h[12:]),
			id:      h[20:walHeader],
			payload: h[walHeader : walHeader+n],
		})
		off += (walHeader + n + walBlock - 1) / walBlock * walBlock
	}
	return out
}

// wal is the open log file.
type wal struct {
	path string
	f    *os.File
	off  int64 // where the next record goes
	size int64 // bytes preallocated
}

// write appends one record and makes it durable. When the write itself
// fails (no space, for one), the record's first block is zeroed again and
// the next record goes to the same place: the caller may report the failure
// and go on. When fdatasync fails, what is on disk is unknown: unsure is set
// and the store must take no further changes.
func (w *wal) write(rec []byte) (unsure bool, err error) {
	if _, err := w.f.WriteAt(rec, w.off); err != nil {
		if _, zerr := w.f.WriteAt(make([]byte, walBlock), w.off); zerr != nil {
			return true, err
		}
		return false, err
	}
	if err := fdatasync(w.f); err != nil {
		return true, err
	}
	w.off += int64(len(rec))
	w.size = max(w.size, w.off)
	return false, nil
}

// fits reports whether a record of n bytes fits before the end of the
// log's working size (an empty log takes any record, growing if needed).
func (w *wal) fits(n int) bool {
	return w.off == 0 || w.off+int64(n) <= max(w.size, walPrealloc)
}

// clear invalidates every record (the first block is zeroed): after a clean
// Close the bbolt file holds everything and the log is empty, so the state
// file alone may be copied, restored or read by another program.
func (w *wal) clear() error {
	if _, err := w.f.WriteAt(make([]byte, walBlock), 0); err != nil {
		return err
	}
	w.off = 0
	return fdatasync(w.f)
}

func fdatasync(f *os.File) error { return fdatasyncFd(int(f.Fd())) }

func walCorrupt(path string, cause string) error {
	return fmt.Errorf("%w: the state log %s cannot be used (%s); localdir will not start and will not overwrite it. "+
		"If the state file next to it was restored from a backup or replaced, stop the driver and move the log aside "+
		"(for example to %s.damaged); changes it holds that the state file lacks are then lost", ErrCorrupt, path, cause, path)
}

// openWAL opens (or creates) the log, carries every change it holds beyond
// the bbolt file into the bbolt file, and readies it for new records. fresh
// says the bbolt file was just created: a log found next to it belongs to a
// state file that is gone and is discarded.
func (s *Store) openWAL(fresh bool) error {
	path := WALPath(s.path)
	var applied uint64
	if err := s.db.View(func(tx *bolt.Tx) error {
		m := tx.Bucket(bucketMeta)
		s.walID = bytes.Clone(m.Get(keyWALID))
		if v := m.Get(keyWALSeq); len(v) == 8 {
			applied = binary.BigEndian.Uint64(v)
		}
		return nil
	}); err != nil {
		return err
	}
	if len(s.walID) != 16 {
		return corrupt(s.path, errors.New("no state log id"))
	}
	_, statErr := os.Lstat(path)
	created := errors.Is(statErr, os.ErrNotExist)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("state log %s: %w", path, err)
	}
	w := &wal{path: path, f: f}
	fail := func(err error) error {
		_ = f.Close()
		return err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fail(fmt.Errorf("state log %s: %w", path, err))
	}
	// The records to replay continue the sequence of the bbolt file; the
	// chain of records ends at the first one that does not continue it.
	var chain, todo []walRecord
	foreign := false
	for _, r := range scanRecords(data) {
		if len(chain) > 0 && r.seq != chain[len(chain)-1].seq+1 {
			break
		}
		if !bytes.Equal(r.id, s.walID) {
			foreign = true
			break
		}
		chain = append(chain, r)
	}
	for _, r := range chain {
		if r.seq > applied {
			todo = append(todo, r)
		}
	}
	if foreign {
		if !fresh {
			return fail(walCorrupt(path, "it holds records of another state file"))
		}
		todo = nil // the state file it belonged to is gone
	}
	if len(todo) > 0 && todo[0].seq != applied+1 {
		return fail(walCorrupt(path, fmt.Sprintf("its records start at %d but the state file %s holds changes up to %d only", todo[0].seq, s.path, applied)))
	}
	if len(todo) > 0 {
		all := newLayer()
		for _, r := range todo {
			l, err := decodeLayer(r.payload)
			if err != nil {
				return fail(walCorrupt(path, fmt.Sprintf("record %d: %v", r.seq, err)))
			}
			all.merge(l)
		}
		last := todo[len(todo)-1].seq
		if err := s.db.Update(func(tx *bolt.Tx) error {
			if err := all.apply(tx); err != nil {
				return err
			}
			return putWALSeq(tx, last)
		}); err != nil {
			return fail(fmt.Errorf("state log %s: carrying records %d to %d into %s: %w", path, todo[0].seq, last, s.path, err))
		}
		applied = last
	}
	s.seq = applied
	if foreign {
		// The old records must not come back after a crash.
		if _, err := f.WriteAt(make([]byte, len(data)), 0); err != nil {
			return fail(fmt.Errorf("state log %s: %w", path, err))
		}
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("state log %s: %w", path, err))
		}
	}
	// Preallocate: fill the file with zeros up to its working size, so that
	// records overwrite allocated, initialized blocks. Only speed depends on
	// it (records are found by their checksums and sequence, whatever lies
	// around them), so a full disk is no reason not to start: records then
	// extend the file.
	w.size = int64(len(data))
	if w.size < walPrealloc {
		if _, err := f.WriteAt(make([]byte, walPrealloc-w.size), w.size); err == nil && f.Sync() == nil {
			w.size = walPrealloc
		}
	}
	if created {
		if err := syncDir(filepath.Dir(path)); err != nil {
			return fail(err)
		}
	}
	s.wal = w
	return nil
}

func putWALSeq(tx *bolt.Tx, seq uint64) error {
	return tx.Bucket(bucketMeta).Put(keyWALSeq, binary.BigEndian.AppendUint64(nil, seq))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// checkpoint carries the pending changes into the bbolt file (one bbolt
// commit) and starts the log over. Only the commit loop (or Open and Close,
// when it is not running) calls it.
func (s *Store) checkpoint() error {
	if s.pending.n == 0 {
		return nil
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := s.pending.apply(tx); err != nil {
			return err
		}
		return putWALSeq(tx, s.seq)
	}); err != nil {
		return err
	}
	s.mu.Lock()
	s.pending = newLayer()
	s.mu.Unlock()
	s.wal.off = 0
	return nil
}

// persist makes one group's changes durable (one log record, one
// fdatasync) and then visible to readers.
func (s *Store) persist(l *layer) error {
	if l.n == 0 {
		return nil
	}
	rec := encodeRecord(s.seq+1, s.walID, l.encode())
	if !s.wal.fits(len(rec)) {
		if err := s.checkpoint(); err != nil {
			s.broken = fmt.Errorf("state file %s: checkpoint failed: %w", s.path, err)
			return s.broken
		}
	}
	if unsure, err := s.wal.write(rec); err != nil {
		err = fmt.Errorf("state log %s: %w", s.wal.path, err)
		if unsure {
			// The record may or may not be on disk: refuse every further
			// change until a restart has read back what is.
			s.broken = err
		}
		return err
	}
	s.seq++
	s.mu.Lock()
	s.pending.merge(l)
	s.mu.Unlock()
	return nil
}

// maybeCheckpoint checkpoints, after a group was acknowledged, when the
// pending changes have grown large or the log is three quarters full (so that
// a group rarely has to wait for a checkpoint before its record fits).
func (s *Store) maybeCheckpoint() {
	if s.broken != nil || (s.pending.n < maxPending && s.wal.off < s.wal.size/4*3) {
		return
	}
	if err := s.checkpoint(); err != nil {
		// Everything acknowledged is durable in the log; only later changes
		// are refused.
		s.broken = fmt.Errorf("state file %s: checkpoint failed: %w", s.path, err)
	}
}
