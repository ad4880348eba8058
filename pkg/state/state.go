// Package state keeps localdir's durable node-local records (volumes,
// snapshots, publications) in a bbolt file under the data root. Every change
// is one fsync'd transaction, committed before the CSI call that caused it is
// acknowledged; concurrent changes share commits (group commit), so N
// parallel creates cost about one fsync.
//
// The CSI name → volume_id index lives in memory, derived from the volume
// records at Open: a durable copy would be rewritten by every create and
// delete. A file that cannot be read is never repaired or replaced (that
// would orphan every volume): Open fails naming it and what to do.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FileName is the name of the state file inside the data root.
const FileName = "state.db"

// formatVersion is stored in the meta bucket; a file of any other format is
// refused rather than misread.
const formatVersion = "2"

var (
	bucketMeta      = []byte("meta")
	bucketVolumes   = []byte("volumes")   // volume_id → JSON Volume
	bucketSnapNames = []byte("snapnames") // CSI snapshot name → snapshot_id
	bucketSnapshots = []byte("snapshots") // snapshot_id → JSON Snapshot
	// bucketPublications: volume_id NUL target_path → JSON Publication.
	bucketPublications = []byte("publications")
	// bucketStages: volume_id NUL staging_path → JSON Stage (image
	// volumes), so a second stage of one volume is told from a publication.
	bucketStages = []byte("stages")
	keyVersion   = []byte("format")
)

// ErrCorrupt wraps every error that means the state file cannot be trusted.
var ErrCorrupt = errors.New("state file is damaged")

// Store is an open state file. All methods are safe for concurrent use.
type Store struct {
	path string
	db   *bolt.DB
	ops  chan *op
	done chan struct{}

	// closeMu orders Close after every Update that got in (read-held while
	// queueing), so no Update sends on the closed queue.
	closeMu sync.RWMutex
	closed  bool

	// names is the CSI name → volume_id index of the committed records, changed
	// only by the commit loop, before the commit's callers are answered.
	namesMu sync.RWMutex
	names   map[string]string
}

// ErrClosed is returned by Update and View after Close.
var ErrClosed = errors.New("state store is closed")

type op struct {
	fn  func(*Tx) error
	err chan error
}

// Open opens (or creates) the state file at path. A file that is not a
// readable state file is ErrCorrupt, never written to.
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

// checkLength refuses a file shorter than its meta page says (an interrupted
// copy): a read-write open would read the missing pages and die of SIGBUS. It
// then reads every page and record a read-write open walks, because bbolt
// walks them in a goroutine of its own that panics beyond any recover on a
// garbled page; here the panic becomes an error naming the file.
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
	if !fresh {
		// Read-only checks first: a file of another format, or one whose
		// names cannot be told from its records, is never written.
		err := s.db.View(func(tx *bolt.Tx) error {
			m := tx.Bucket(bucketMeta)
			if m == nil {
				return errors.New("no meta bucket: not a localdir state file")
			}
			if version := string(m.Get(keyVersion)); version != formatVersion {
				return fmt.Errorf("format version %q, this driver reads %q", version, formatVersion)
			}
			var err error
			s.names, err = namesOf(tx.Bucket(bucketVolumes))
			return err
		})
		if err != nil {
			return corrupt(s.path, err)
		}
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketVolumes, bucketSnapNames, bucketSnapshots, bucketPublications, bucketStages} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketMeta).Put(keyVersion, []byte(formatVersion))
	})
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

// Update runs fn in a read-write transaction and returns once it is durably
// committed; calls arriving during a commit share the next one. fn may run
// more than once (a group is retried without a failing fn), so it must
// depend only on what it reads through tx.
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

// commitLoop is the group committer: queued ops share one transaction and
// its result. Unlike bolt.DB.Batch it never waits for a timer: a lone caller
// commits at once.
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
