// Package state keeps localdir's durable node-local records in a bbolt file
// under the data root: the volumes, the snapshots and their CSI names. Every
// change is one fsync'd bbolt transaction, committed before the caller
// acknowledges the CSI call that caused it. Concurrent changes share commits
// (group commit), so N parallel CreateVolume calls cost about one fsync round
// instead of N.
//
// The CSI name → volume_id index is kept in memory, derived from the volume
// records (each holds its name) when the file is opened and updated with
// every commit; it is not a second durable copy of the names. Format 1 files
// also kept it in a bucket of their own: its pages were rewritten by every
// create and delete, on top of those of the volume records (two of the six
// pages a commit wrote with 2,000 volumes), so format 2 dropped it. A format
// 1 file is migrated when it is opened (one transaction), after checking that
// its name bucket and its records agree.
//
// The store never repairs or rewrites a file it cannot read: Open fails with
// an error naming the file and what to do (a damaged state file must be
// restored from a backup or moved away by a person, never silently replaced by
// an empty one, because that would orphan every volume).
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// FileName is the name of the state file inside the data root.
const FileName = "state.db"

// formatVersion is stored in the meta bucket; a file written by a newer,
// incompatible format is refused rather than misread. Format 1 had a names
// bucket (CSI volume name → volume_id) next to the volume records; format 2
// derives that index from the records. Drivers that read only format 1
// refuse a format 2 file (they would miss the names).
const (
	formatVersion = "2"
	formatV1      = "1"
)

var (
	bucketMeta      = []byte("meta")
	bucketNames     = []byte("names")     // format 1 only: CSI volume name → volume_id
	bucketVolumes   = []byte("volumes")   // volume_id → JSON Volume
	bucketSnapNames = []byte("snapnames") // CSI snapshot name → snapshot_id
	bucketSnapshots = []byte("snapshots") // snapshot_id → JSON Snapshot
	keyVersion      = []byte("format")
)

// ErrCorrupt wraps every error that means the state file cannot be trusted.
var ErrCorrupt = errors.New("state file is damaged")

// volumeJSON is how a contract.Volume is stored: the same fields (a Go
// conversion between the two ignores the tags), named in JSON. Changing a
// tag changes the file format.
type volumeJSON struct {
	ID               string            `json:"id"`
	Name             string            `json:"name,omitempty"`
	CapacityBytes    int64             `json:"capacityBytes"`
	AccessType       string            `json:"accessType"`
	Parameters       map[string]string `json:"parameters,omitempty"`
	SourceSnapshotID string            `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID   string            `json:"sourceVolumeID,omitempty"`
	Ephemeral        bool              `json:"ephemeral,omitempty"`
	EphemeralID      string            `json:"ephemeralID,omitempty"`
	Engine           string            `json:"engine,omitempty"`
	CreatedAt        time.Time         `json:"createdAt"`
	Node             string            `json:"-"`
}

// snapshotJSON is how a contract.Snapshot is stored.
type snapshotJSON struct {
	ID             string    `json:"id"`
	Name           string    `json:"name"`
	SourceVolumeID string    `json:"sourceVolumeID"`
	SizeBytes      int64     `json:"sizeBytes"`
	AccessType     string    `json:"accessType"`
	Engine         string    `json:"engine,omitempty"`
	CreatedAt      time.Time `json:"createdAt"`
	Node           string    `json:"-"`
}

// Store is an open state file. All methods are safe for concurrent use.
type Store struct {
	path string
	db   *bolt.DB
	ops  chan *op
	done chan struct{}

	// closeMu orders Close after every Update that got in: Update holds it
	// for reading while it queues, Close for writing while it marks the
	// store closed, so no Update ever sends on the closed queue.
	closeMu sync.RWMutex
	closed  bool

	// names is the CSI volume name → volume_id index of the committed
	// records (Volume.Name), built at Open. Only the commit loop changes
	// it, right after a commit succeeded and before the callers of that
	// commit are answered.
	namesMu sync.RWMutex
	names   map[string]string
}

// ErrClosed is returned by Update and View after Close.
var ErrClosed = errors.New("state store is closed")

type op struct {
	fn  func(*Tx) error
	err chan error
}

// Open opens (or, if absent, creates) the state file at path. It fails with
// an error wrapping ErrCorrupt, naming the file and the way out, when the
// file exists but is not a readable localdir state file; it never writes to
// such a file.
func Open(path string) (*Store, error) {
	fresh := false
	if fi, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		fresh = true
	} else if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	} else if fi.Size() == 0 {
		return nil, corrupt(path, errors.New("file is empty"))
	} else if err := checkLength(path, fi.Size()); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        5 * time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Pre-size the file so commits rarely grow it: a commit that does
		// not change the file size costs fdatasync without a journal commit.
		InitialMmapSize: 16 << 20,
	})
	if err != nil {
		return nil, openError(path, err)
	}
	s := &Store{path: path, db: db, ops: make(chan *op, 4096), done: make(chan struct{}), names: map[string]string{}}
	if err := s.initBuckets(fresh); err != nil {
		_ = db.Close()
		return nil, err
	}
	go s.commitLoop()
	return s, nil
}

func openError(path string, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || err.Error() == "timeout" {
		return fmt.Errorf("state file %s is locked by another process (is another localdir-csi running on this data root?)", path)
	}
	return corrupt(path, err)
}

// checkLength refuses a file shorter than its meta page says, as left by an
// interrupted copy or restore. bbolt maps the missing pages, and reading them
// (which a read-write open does at once, rebuilding the free list) kills the
// process with SIGBUS. A read-only open reads only the meta pages.
//
// It then reads every page a read-write open would walk (every key of every
// bucket) and decodes every volume and snapshot record: a read-write open
// walks the pages in a goroutine of bbolt's own that panics on a garbled
// one, beyond any recover, and a garbled record would only fail later,
// without naming the file. bbolt's page checks panic here too, in this
// goroutine, where the panic becomes the error.
func checkLength(path string, size int64) (err error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return openError(path, err)
	}
	defer db.Close()
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		if need := tx.Size(); need > size {
			return corrupt(path, fmt.Errorf("file is %d bytes, its header refers to %d: it was cut short", size, need))
		}
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			var rec func() any
			switch string(name) {
			case string(bucketVolumes):
				rec = func() any { return &volumeJSON{} }
			case string(bucketSnapshots):
				rec = func() any { return &snapshotJSON{} }
			}
			return b.ForEach(func(k, v []byte) error {
				if rec == nil {
					return nil
				}
				if err := json.Unmarshal(v, rec()); err != nil {
					return corrupt(path, fmt.Errorf("record %q in %s: %v", k, name, err))
				}
				return nil
			})
		})
	})
}

func corrupt(path string, cause error) error {
	return fmt.Errorf("%w: %s cannot be read (%v); localdir will not start and will not overwrite it. "+
		"Stop the driver, restore the file from a backup or move it aside (for example to %s.damaged) after "+
		"recovering what you need from it, then start the driver again", ErrCorrupt, path, cause, path)
}

func (s *Store) initBuckets(fresh bool) error {
	version := formatVersion
	var taken []string // format 1: records to mark as not holding their name
	if !fresh {
		// Read-only checks first: a file of another format, or one whose
		// names cannot be told from its records, is never written.
		err := s.db.View(func(tx *bolt.Tx) error {
			m := tx.Bucket(bucketMeta)
			if m == nil {
				return errors.New("no meta bucket: not a localdir state file")
			}
			version = string(m.Get(keyVersion))
			var err error
			switch version {
			case formatVersion:
				if tx.Bucket(bucketNames) != nil {
					return fmt.Errorf("format %s file with a format %s names bucket", formatVersion, formatV1)
				}
				s.names, err = namesOf(tx.Bucket(bucketVolumes))
			case formatV1:
				s.names, taken, err = namesV1(tx.Bucket(bucketNames), tx.Bucket(bucketVolumes))
			default:
				err = fmt.Errorf("format version %q, this driver reads %q and %q", version, formatV1, formatVersion)
			}
			return err
		})
		if err != nil {
			return corrupt(s.path, err)
		}
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketVolumes, bucketSnapNames, bucketSnapshots} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if version == formatV1 {
			// Migration, in this one transaction: from now on the index
			// is rebuilt from the records at every open.
			t := &Tx{tx: tx, s: s}
			for _, id := range taken {
				if err := t.markNameTaken(id); err != nil {
					return err
				}
			}
			if tx.Bucket(bucketNames) != nil {
				if err := tx.DeleteBucket(bucketNames); err != nil {
					return err
				}
			}
		}
		return tx.Bucket(bucketMeta).Put(keyVersion, []byte(formatVersion))
	})
}

// recordName is what the index needs of a stored volume record.
type recordName struct {
	Name      string `json:"name"`
	NameTaken bool   `json:"nameTaken"`
}

func decodeName(k, raw []byte) (recordName, error) {
	var r recordName
	if err := json.Unmarshal(raw, &r); err != nil {
		return r, fmt.Errorf("record %q in %s: %v", k, bucketVolumes, err)
	}
	return r, nil
}

// namesOf builds the name index of a format 2 file from its volume records
// (vols nil: none). Two records holding one name cannot be told apart: the
// file is refused.
func namesOf(vols *bolt.Bucket) (map[string]string, error) {
	names := map[string]string{}
	if vols == nil {
		return names, nil
	}
	err := vols.ForEach(func(k, raw []byte) error {
		r, err := decodeName(k, raw)
		if err != nil || r.Name == "" || r.NameTaken {
			return err
		}
		if other, ok := names[r.Name]; ok {
			return fmt.Errorf("volume records %s and %s both hold the name %q", other, k, r.Name)
		}
		names[r.Name] = string(k)
		return nil
	})
	return names, err
}

// namesV1 reads the index of a format 1 file: its names bucket, each entry
// checked against the record it names (which must exist and carry that
// name: otherwise the migration would lose or change a name, and the file
// is refused). It also returns the records whose name maps to another
// volume (a later PutVolume of the same name took it over), which the
// migration marks as such.
func namesV1(names, vols *bolt.Bucket) (map[string]string, []string, error) {
	index := map[string]string{}
	if names != nil {
		err := names.ForEach(func(k, v []byte) error {
			var raw []byte
			if vols != nil {
				raw = vols.Get(v)
			}
			if raw == nil {
				return fmt.Errorf("names bucket maps %q to %q, which has no record", k, v)
			}
			r, err := decodeName(v, raw)
			if err != nil {
				return err
			}
			if r.Name != string(k) {
				return fmt.Errorf("names bucket maps %q to %q, whose record has the name %q", k, v, r.Name)
			}
			index[string(k)] = string(v)
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	var taken []string
	if vols != nil {
		err := vols.ForEach(func(k, raw []byte) error {
			r, err := decodeName(k, raw)
			if err == nil && r.Name != "" && index[r.Name] != string(k) {
				taken = append(taken, string(k))
			}
			return err
		})
		if err != nil {
			return nil, nil, err
		}
	}
	return index, taken, nil
}

// Path is the file the store reads and writes.
func (s *Store) Path() string { return s.path }

// Close waits for queued updates and closes the file.
func (s *Store) Close() error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	close(s.ops)
	s.closeMu.Unlock()
	<-s.done
	return s.db.Close()
}

// View runs fn in a read-only transaction (no fsync, never blocked by a
// commit in flight).
func (s *Store) View(fn func(*Tx) error) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return ErrClosed
	}
	return s.db.View(func(tx *bolt.Tx) error { return fn(&Tx{tx: tx, s: s}) })
}

// Update runs fn in a read-write transaction and returns once that
// transaction is durably committed (fsync'd). Calls that arrive while a
// commit is in flight are grouped into the next one. fn may run more than
// once (when another fn in its group fails, the group is retried without the
// failing one), so it must only depend on what it reads through tx.
func (s *Store) Update(fn func(*Tx) error) error {
	o := &op{fn: fn, err: make(chan error, 1)}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	s.ops <- o
	s.closeMu.RUnlock()
	return <-o.err
}

// commitLoop is the group committer: it takes every queued op, runs them in
// one bbolt transaction and reports the one commit result to all of them.
// Unlike bolt.DB.Batch it never waits for a timer, so a lone caller commits
// at once and only callers that queued during a commit share the next one.
func (s *Store) commitLoop() {
	defer close(s.done)
	var group []*op
	for first := range s.ops {
		group = append(group[:0], first)
	drain:
		for len(group) < 1024 {
			select {
			case o, ok := <-s.ops:
				if !ok {
					break drain
				}
				group = append(group, o)
			default:
				break drain
			}
		}
		s.commit(group)
	}
}

func (s *Store) commit(group []*op) {
	for len(group) > 0 {
		failed := -1
		var ferr error
		var t *Tx
		err := s.db.Update(func(tx *bolt.Tx) error {
			t = &Tx{tx: tx, s: s}
			for i, o := range group {
				if err := o.fn(t); err != nil {
					failed, ferr = i, err
					return err
				}
			}
			return nil
		})
		if failed >= 0 {
			group[failed].err <- ferr
			group = append(group[:failed], group[failed+1:]...)
			continue
		}
		if err == nil {
			s.applyNames(t.names)
		}
		for _, o := range group {
			o.err <- err
		}
		return
	}
}

// applyNames makes a committed transaction's name changes (name → id, ""
// for a name that went) part of the index.
func (s *Store) applyNames(changes map[string]string) {
	if len(changes) == 0 {
		return
	}
	s.namesMu.Lock()
	defer s.namesMu.Unlock()
	for name, id := range changes {
		if id == "" {
			delete(s.names, name)
		} else {
			s.names[name] = id
		}
	}
}

// Tx is one transaction over the records.
type Tx struct {
	tx *bolt.Tx
	s  *Store
	// names are the name index changes of this write transaction (name →
	// id, "" for a name that goes), applied to Store.names once it is
	// committed and dropped if it is not.
	names map[string]string
}

// VolumeIDByName returns the volume_id recorded for a CSI name, or "".
//
// The answer is always a record this transaction sees, of that name: the
// index (the last commit, plus this transaction's own changes) gives the
// candidate, and the record is checked. A read transaction that began
// before the latest commits gets "" for a name created by them, as it
// does not see their records.
func (t *Tx) VolumeIDByName(name string) string {
	id, ok := t.names[name]
	if !ok {
		t.s.namesMu.RLock()
		id = t.s.names[name]
		t.s.namesMu.RUnlock()
	}
	if id == "" || t.indexedName(id) != name {
		return ""
	}
	return id
}

// indexedName is the name under which the record of volume id is found
// ("" when there is no record, it has no name, or another volume took its
// name over; a damaged record shows in Volume).
func (t *Tx) indexedName(id string) string {
	raw := t.tx.Bucket(bucketVolumes).Get([]byte(id))
	if raw == nil {
		return ""
	}
	r, err := decodeName(nil, raw)
	if err != nil || r.NameTaken {
		return ""
	}
	return r.Name
}

// markNameTaken rewrites the record of volume id as no longer found by its
// name, which another volume's record now holds. The name stays in it.
func (t *Tx) markNameTaken(id string) error {
	b := t.tx.Bucket(bucketVolumes)
	rec := volumeRecord{volumeJSON: &volumeJSON{}}
	if ok, err := get(b, id, &rec); !ok || err != nil {
		return err
	}
	rec.NameTaken = true
	return put(b, id, rec)
}

func (t *Tx) setName(name, id string) {
	if t.names == nil {
		t.names = map[string]string{}
	}
	t.names[name] = id
}

// Volume returns the record for id, or nil when there is none.
func (t *Tx) Volume(id string) (*contract.Volume, error) {
	v := &volumeJSON{}
	ok, err := get(t.tx.Bucket(bucketVolumes), id, v)
	if !ok {
		return nil, err
	}
	return (*contract.Volume)(v), err
}

// volumeRecord is a volume as stored. NameTaken marks a record whose name
// another volume's record took over (PutVolume of another volume with the
// same name): VolumeIDByName does not find it under that name any more.
type volumeRecord struct {
	*volumeJSON
	NameTaken bool `json:"nameTaken,omitempty"`
}

// PutVolume stores v and, when v.Name is set, makes VolumeIDByName(v.Name)
// find it (a volume found by that name until then no longer is).
func (t *Tx) PutVolume(v *contract.Volume) error {
	if v.Name != "" {
		if other := t.VolumeIDByName(v.Name); other != "" && other != v.ID {
			if err := t.markNameTaken(other); err != nil {
				return err
			}
		}
	}
	if old := t.indexedName(v.ID); old != "" && old != v.Name {
		t.setName(old, "")
	}
	if err := put(t.tx.Bucket(bucketVolumes), v.ID, volumeRecord{volumeJSON: (*volumeJSON)(v)}); err != nil {
		return err
	}
	if v.Name != "" {
		t.setName(v.Name, v.ID)
	}
	return nil
}

// DeleteVolume removes the record for id (and so its name).
func (t *Tx) DeleteVolume(id string) error {
	v, err := t.Volume(id)
	if err != nil || v == nil {
		return err
	}
	found := v.Name != "" && t.VolumeIDByName(v.Name) == id
	if err := t.tx.Bucket(bucketVolumes).Delete([]byte(id)); err != nil {
		return err
	}
	if found {
		t.setName(v.Name, "")
	}
	return nil
}

// ForEachVolume calls fn for the volumes whose id sorts after `after`
// (all when empty), in id order, until fn returns false.
func (t *Tx) ForEachVolume(after string, fn func(*contract.Volume) bool) error {
	return forEach(t.tx.Bucket(bucketVolumes), after, func() any { return &volumeJSON{} },
		func(x any) bool { return fn((*contract.Volume)(x.(*volumeJSON))) })
}

// SnapshotIDByName returns the snapshot_id recorded for a CSI name, or "".
func (t *Tx) SnapshotIDByName(name string) string {
	return string(t.tx.Bucket(bucketSnapNames).Get([]byte(name)))
}

// Snapshot returns the record for id, or nil when there is none.
func (t *Tx) Snapshot(id string) (*contract.Snapshot, error) {
	s := &snapshotJSON{}
	ok, err := get(t.tx.Bucket(bucketSnapshots), id, s)
	if !ok {
		return nil, err
	}
	return (*contract.Snapshot)(s), err
}

// PutSnapshot stores s and its name mapping.
func (t *Tx) PutSnapshot(s *contract.Snapshot) error {
	if err := t.tx.Bucket(bucketSnapNames).Put([]byte(s.Name), []byte(s.ID)); err != nil {
		return err
	}
	return put(t.tx.Bucket(bucketSnapshots), s.ID, (*snapshotJSON)(s))
}

// DeleteSnapshot removes the record for id and its name mapping.
func (t *Tx) DeleteSnapshot(id string) error {
	s, err := t.Snapshot(id)
	if err != nil || s == nil {
		return err
	}
	if t.SnapshotIDByName(s.Name) == id {
		if err := t.tx.Bucket(bucketSnapNames).Delete([]byte(s.Name)); err != nil {
			return err
		}
	}
	return t.tx.Bucket(bucketSnapshots).Delete([]byte(id))
}

// ForEachSnapshot calls fn for the snapshots whose id sorts after `after`,
// in id order, until fn returns false.
func (t *Tx) ForEachSnapshot(after string, fn func(*contract.Snapshot) bool) error {
	return forEach(t.tx.Bucket(bucketSnapshots), after, func() any { return &snapshotJSON{} },
		func(x any) bool { return fn((*contract.Snapshot)(x.(*snapshotJSON))) })
}

func get(b *bolt.Bucket, id string, into any) (bool, error) {
	raw := b.Get([]byte(id))
	if raw == nil {
		return false, nil
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return true, fmt.Errorf("%w: record %q: %v", ErrCorrupt, id, err)
	}
	return true, nil
}

func put(b *bolt.Bucket, id string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put([]byte(id), raw)
}

func forEach(b *bolt.Bucket, after string, alloc func() any, fn func(any) bool) error {
	c := b.Cursor()
	var k, v []byte
	if after == "" {
		k, v = c.First()
	} else {
		k, v = c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
	}
	for ; k != nil; k, v = c.Next() {
		x := alloc()
		if err := json.Unmarshal(v, x); err != nil {
			return fmt.Errorf("%w: record %q: %v", ErrCorrupt, k, err)
		}
		if !fn(x) {
			return nil
		}
	}
	return nil
}
