package volume

import (
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// What the node side (pkg/publish) reads and records through the Store:
// where a volume's data is, what a directory volume uses, and the
// publications it makes (the pod each is for), which live in the state
// file with the volumes.

// ImagePath is the image file of image volume id (a valid volume_id).
func (m *Store) ImagePath(id string) string { return m.imagePath(id) }

// Usage measures directory volume v's data with the engine it was made
// with: the bytes its files occupy and their inode count (-1 when the
// engine has no inode figure).
func (m *Store) Usage(v *contract.Volume) (used, inodes int64, err error) {
	eng := m.eng
	if v.Engine == engine.Dir && eng.Name() != engine.Dir {
		if eng, err = engine.New(engine.Dir, m.root); err != nil {
			return 0, 0, err
		}
	}
	return eng.Usage(m.volDir(v.ID))
}

// PutPublication records a publication (replacing the one of the same
// volume and target path).
func (m *Store) PutPublication(p *state.Publication) error {
	return m.st.Update(func(tx *state.Tx) error { return tx.PutPublication(p) })
}

// DeletePublication removes the record of volume id's publication at
// targetPath; a missing one is fine.
func (m *Store) DeletePublication(id, targetPath string) error {
	return m.st.Update(func(tx *state.Tx) error { return tx.DeletePublication(id, targetPath) })
}

// Publication is the record of volume id's publication at targetPath, nil
// when there is none.
func (m *Store) Publication(id, targetPath string) (*state.Publication, error) {
	var p *state.Publication
	err := m.st.View(func(tx *state.Tx) (err error) { p, err = tx.Publication(id, targetPath); return err })
	return p, err
}

// Publications lists the recorded publications of volume id ("" for
// every volume's).
func (m *Store) Publications(id string) ([]*state.Publication, error) {
	var out []*state.Publication
	err := m.st.View(func(tx *state.Tx) (err error) { out, err = tx.Publications(id); return err })
	return out, err
}
