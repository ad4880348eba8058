package volume

import (
	"fmt"
	"maps"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Modify applies mutable parameters to volume id (CSI ControllerModifyVolume;
// contract.CheckMutable says which volume takes which) and records them; only
// the keys given change. Applying is idempotent, so a retry finishes a modify
// a crash cut short. Errors: contract.ErrNotFound, contract.ErrInvalid,
// contract.ErrBusy.
func (m *Store) Modify(id string, params map[string]string) (*contract.Volume, error) {
	mut, err := contract.MutableOf(params)
	if err != nil {
		return nil, err
	}
	release, err := m.lockChange("a modify", id)
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

// applyMutable checks that v can take mut and applies its data's part at
// path: dirMode on a directory volume's root, btrfs compression on its tree.
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
