package state

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// volumeJSON is how a contract.Volume is stored (the same fields, converted
// directly); its tags are the file format.
type volumeJSON struct {
	ID            string              `json:"id"`
	Name          string              `json:"name,omitempty"`
	CapacityBytes int64               `json:"capacityBytes"`
	AccessType    contract.AccessType `json:"accessType"`
	FsType        string              `json:"fsType,omitempty"`
	Parameters    map[string]string   `json:"parameters,omitempty"`
	// MutableParameters: added after format 2; older records lack it.
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	SourceSnapshotID  string            `json:"sourceSnapshotID,omitempty"`
	SourceVolumeID    string            `json:"sourceVolumeID,omitempty"`
	Ephemeral         bool              `json:"ephemeral,omitempty"`
	EphemeralID       string            `json:"ephemeralID,omitempty"`
	Engine            contract.Engine   `json:"engine,omitempty"`
	CreatedAt         time.Time         `json:"createdAt"`
	Node              string            `json:"-"`
	// KeySalt, FillFrom: added after format 2; only encrypted directory
	// volumes.
	KeySalt  []byte `json:"keySalt,omitempty"`
	FillFrom string `json:"fillFrom,omitempty"`
}

// snapshotJSON is how a contract.Snapshot is stored.
type snapshotJSON struct {
	ID             string              `json:"id"`
	Name           string              `json:"name"`
	SourceVolumeID string              `json:"sourceVolumeID"`
	SizeBytes      int64               `json:"sizeBytes"`
	AccessType     contract.AccessType `json:"accessType"`
	FsType         string              `json:"fsType,omitempty"`
	Engine         contract.Engine     `json:"engine,omitempty"`
	CreatedAt      time.Time           `json:"createdAt"`
	// GroupSnapshotID: added after format 2; older records lack it.
	GroupSnapshotID string   `json:"groupSnapshotID,omitempty"`
	Node            string   `json:"-"`
	Nodes           []string `json:"-"`
	// Copy: received from the node the snapshot was cut on.
	Copy bool `json:"copy,omitempty"`
	// KeySalt: added after format 2; only of encrypted directory volumes.
	KeySalt []byte `json:"keySalt,omitempty"`
}

// Tx is one transaction over the records.
type Tx struct {
	tx *bolt.Tx
	s  *Store
	// names are this write transaction's name index changes (name → id, "":
	// gone), applied to Store.names once committed.
	names map[string]string
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
// another volume's record took over: VolumeIDByName no longer finds it.
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

// Publication is a volume published at a target path for a pod (the
// pod.uid of NodePublishVolume's volume_context), kept so the node finds the
// pod's cgroups for I/O limits and freezes until NodeUnpublishVolume.
type Publication struct {
	VolumeID    string `json:"volumeID"`
	TargetPath  string `json:"targetPath"`
	StagingPath string `json:"stagingPath,omitempty"`
	PodUID      string `json:"podUID"`
}

func publicationKey(volumeID, targetPath string) []byte {
	return []byte(volumeID + "\x00" + targetPath)
}

// PutPublication stores p, replacing the one of its volume and target path.
func (t *Tx) PutPublication(p *Publication) error {
	return put(t.tx.Bucket(bucketPublications), string(publicationKey(p.VolumeID, p.TargetPath)), p)
}

// Publication returns the publication of volumeID at targetPath, or nil.
func (t *Tx) Publication(volumeID, targetPath string) (*Publication, error) {
	p := &Publication{}
	ok, err := get(t.tx.Bucket(bucketPublications), string(publicationKey(volumeID, targetPath)), p)
	if !ok {
		return nil, err
	}
	return p, err
}

// DeletePublication removes the publication of volumeID at targetPath, if any.
func (t *Tx) DeletePublication(volumeID, targetPath string) error {
	return t.tx.Bucket(bucketPublications).Delete(publicationKey(volumeID, targetPath))
}

// Stage is an image volume staged at a staging path (NodeStageVolume),
// until NodeUnstageVolume there.
type Stage struct {
	VolumeID    string `json:"volumeID"`
	StagingPath string `json:"stagingPath"`
}

// PutStage records s.
func (t *Tx) PutStage(s *Stage) error {
	return put(t.tx.Bucket(bucketStages), string(publicationKey(s.VolumeID, s.StagingPath)), s)
}

// DeleteStage removes the stage of volumeID at stagingPath, if any.
func (t *Tx) DeleteStage(volumeID, stagingPath string) error {
	return t.tx.Bucket(bucketStages).Delete(publicationKey(volumeID, stagingPath))
}

// StagingPaths lists where volumeID is recorded as staged.
func (t *Tx) StagingPaths(volumeID string) ([]string, error) {
	var out []string
	c := t.tx.Bucket(bucketStages).Cursor()
	prefix := append([]byte(volumeID), 0)
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		s := &Stage{}
		if err := json.Unmarshal(v, s); err != nil {
			return nil, fmt.Errorf("%w: record %q: %v", ErrCorrupt, k, err)
		}
		out = append(out, s.StagingPath)
	}
	return out, nil
}

// Publications returns the publications of volumeID ("": of every
// volume), in volume_id and target path order.
func (t *Tx) Publications(volumeID string) ([]*Publication, error) {
	var out []*Publication
	c := t.tx.Bucket(bucketPublications).Cursor()
	prefix := []byte(volumeID)
	if volumeID != "" {
		prefix = append(prefix, 0)
	}
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		p := &Publication{}
		if err := json.Unmarshal(v, p); err != nil {
			return nil, fmt.Errorf("%w: record %q: %v", ErrCorrupt, k, err)
		}
		out = append(out, p)
	}
	return out, nil
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
