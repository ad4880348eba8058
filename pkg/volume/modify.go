package volume

import (
	"fmt"
	"maps"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Modify applies mutable parameters to volume id (CSI
// ControllerModifyVolume; contract.ParseMutable names them) and records
// them with the volume: only the keys given change. compression sets the
// btrfs compression property on the volume's whole tree (engine.
// SetCompression: later writes are compressed); dirMode chmods the
// volume's root (an image volume's filesystem root where it is staged, and
// at each later stage); the I/O limits (contract.IOLimitParameters) are
// set on the cgroups of every pod the volume is published for (pods.go).
// dirMode applies to filesystem volumes, compression to directory volumes
// on btrfs, I/O limits to image volumes (raw block, ext4, xfs). Applying is idempotent:
// a modify a crash cut short between the data and the record is finished
// by its retry. It returns the volume as recorded afterwards.
// Errors: contract.ErrNotFound, contract.ErrInvalid (a parameter this
// volume cannot take, named), contract.ErrBusy (a snapshot, clone or other
// change of it is in progress).
func (m *Store) Modify(id string, params map[string]string) (*contract.Volume, error) {
	mut, err := contract.MutableOf(params)
	if err != nil {
		return nil, err
	}
	unlock, err := m.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	release, err := m.holds.change(id, "a modify")
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if err := m.applyMutable(v, m.dataPath(v), mut); err != nil {
		return nil, err
	}
	merged := contract.MergeMutable(v.MutableParameters, params)
	if err := m.node.ApplyMutable(v, mut, merged); err != nil {
		return nil, err
	}
	if maps.Equal(merged, v.MutableParameters) {
		return v, nil
	}
	v.MutableParameters = merged
	if err := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(v) }); err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Volume modified", "volumeID", id, "mutableParameters", params)
	return v, nil
}

// applyMutable checks that v can take mut and applies it to its data at
// path.
func (m *Store) applyMutable(v *contract.Volume, path string, mut contract.Mutable) error {
	if err := contract.CheckMutable(v, engine.OnBtrfs(path), mut); err != nil {
		return err
	}
	// An image volume's root is its filesystem's: the node side sets it
	// where the volume is staged (Modify) and at each stage.
	if mut.DirMode != nil && v.FsType == "" {
		if err := engine.ChmodRoot(path, *mut.DirMode); err != nil {
			return fmt.Errorf("volume %s: %w", v.ID, err)
		}
	}
	if mut.Compression != nil {
		if err := engine.SetCompression(path, *mut.Compression); err != nil {
			return fmt.Errorf("set compression of volume %s: %w", v.ID, err)
		}
	}
	return nil
}
