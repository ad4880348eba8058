package state

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

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

// namesOf builds the name index from the volume records (vols nil: none); two
// records of one name cannot be told apart, so the file is refused.
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

// VolumeIDByName returns the volume_id recorded for a CSI name, or "". The
// answer is always a record of that name this transaction sees: the index
// (last commit plus this transaction's changes) gives the candidate and the
// record is checked, so an older read transaction misses newer names.
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

// indexedName is the name the record of volume id is found under ("" for no
// record, no name, or a name another volume took over).
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
