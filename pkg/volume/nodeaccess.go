package volume

import (
	"context"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// NodeAccess is what the node side (pkg/publish) may do with a Store's
// volumes and its publication records; it implements publish.Volumes.
type NodeAccess struct{ m *Store }

// NodeAccess returns the node side's access to the store.
func (m *Store) NodeAccess() *NodeAccess { return &NodeAccess{m} }

// Get is Store.Get.
func (a *NodeAccess) Get(id string) (*contract.Volume, error) { return a.m.Get(id) }

// Resolve is Store.Resolve.
func (a *NodeAccess) Resolve(id string) (*contract.Volume, error) { return a.m.Resolve(id) }

// LookupByName is Store.LookupByName.
func (a *NodeAccess) LookupByName(name string) (*contract.Volume, error) {
	return a.m.LookupByName(name)
}

// Create is Store.Create.
func (a *NodeAccess) Create(spec contract.CreateSpec) (*contract.Volume, error) {
	return a.m.Create(spec)
}

// Delete is Store.Delete.
func (a *NodeAccess) Delete(id string) error { return a.m.Delete(id) }

// EncryptedDirs returns the encrypted directory volumes.
func (a *NodeAccess) EncryptedDirs() ([]*contract.Volume, error) {
	all, _, err := a.m.List("", 0)
	var out []*contract.Volume
	for _, v := range all {
		if v.EncryptedDir() {
			out = append(out, v)
		}
	}
	return out, err
}

// EncryptedSnapshotDirs returns the directories of the snapshots of
// encrypted directory volumes.
func (a *NodeAccess) EncryptedSnapshotDirs() ([]string, error) {
	all, _, err := a.m.snaps.List("", 0, "")
	var out []string
	for _, s := range all {
		if s.KeySalt != nil && !s.Image() {
			out = append(out, a.m.snapPath(s))
		}
	}
	return out, err
}

// FillPending is Store.FillPending.
func (a *NodeAccess) FillPending(v *contract.Volume, id fscrypt.Identifier) (*contract.Volume, error) {
	return a.m.FillPending(v, id)
}

// Root is Store.Root.
func (a *NodeAccess) Root() string { return a.m.root }

// DataPath is Store.DataPath.
func (a *NodeAccess) DataPath(v *contract.Volume) string { return a.m.dataPath(v) }

// Lock is Store.lock.
func (a *NodeAccess) Lock(keys ...string) (func(), error) { return a.m.lock(keys...) }

// LockWait takes volume id's lock, waiting (bounded by ctx, then
// contract.ErrBusy): for the teardowns a CO must be able to finish.
func (a *NodeAccess) LockWait(ctx context.Context, id string) (func(), error) {
	return a.m.locks.Wait(ctx, "volume", id)
}

// HoldRead takes a read hold on volume id for what (a stage, a node
// expansion; see holdSet); the returned func releases it.
func (a *NodeAccess) HoldRead(id, what string) (func(), error) { return a.m.holds.read(id, what) }

// ImagePath is the image file of image volume id (a valid volume_id).
func (a *NodeAccess) ImagePath(id string) string { return a.m.imagePath(id) }

// ImageDir is the directory of the image files.
func (a *NodeAccess) ImageDir() string { return a.m.blockRoot }

// ApplySize makes volume v's data its recorded size again (NodeExpandVolume).
func (a *NodeAccess) ApplySize(v *contract.Volume) error { return a.m.resizeData(v, v.CapacityBytes) }

// Usage measures directory volume v with the engine it was made with: bytes
// and inodes (-1: unknown).
func (a *NodeAccess) Usage(v *contract.Volume) (used, inodes int64, err error) {
	eng := a.m.eng
	if v.Engine == engine.Dir && eng.Name() != engine.Dir {
		if eng, err = engine.New(engine.Dir, a.m.root); err != nil {
			return 0, 0, err
		}
	}
	return eng.Usage(a.m.volDir(v.ID))
}

// PutStage records image volume id as staged at stagingPath.
func (a *NodeAccess) PutStage(id, stagingPath string) error {
	return a.m.st.Update(func(tx *state.Tx) error { return tx.PutStage(&state.Stage{VolumeID: id, StagingPath: stagingPath}) })
}

// DeleteStage removes that record; a missing one is fine.
func (a *NodeAccess) DeleteStage(id, stagingPath string) error {
	return a.m.st.Update(func(tx *state.Tx) error { return tx.DeleteStage(id, stagingPath) })
}

// StagingPaths lists where volume id is recorded as staged.
func (a *NodeAccess) StagingPaths(id string) ([]string, error) {
	var out []string
	err := a.m.st.View(func(tx *state.Tx) (err error) { out, err = tx.StagingPaths(id); return err })
	return out, err
}

// PutPublication records a publication (replacing the one of the same
// volume and target path).
func (a *NodeAccess) PutPublication(p *state.Publication) error {
	return a.m.st.Update(func(tx *state.Tx) error { return tx.PutPublication(p) })
}

// DeletePublication removes the record of volume id's publication at
// targetPath; a missing one is fine.
func (a *NodeAccess) DeletePublication(id, targetPath string) error {
	return a.m.st.Update(func(tx *state.Tx) error { return tx.DeletePublication(id, targetPath) })
}

// Publication is the record of volume id's publication at targetPath, nil
// when there is none.
func (a *NodeAccess) Publication(id, targetPath string) (*state.Publication, error) {
	var p *state.Publication
	err := a.m.st.View(func(tx *state.Tx) (err error) { p, err = tx.Publication(id, targetPath); return err })
	return p, err
}

// Publications lists the recorded publications of volume id ("" for
// every volume's).
func (a *NodeAccess) Publications(id string) ([]*state.Publication, error) {
	var out []*state.Publication
	err := a.m.st.View(func(tx *state.Tx) (err error) { out, err = tx.Publications(id); return err })
	return out, err
}
