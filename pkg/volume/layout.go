package volume

import (
	"fmt"
	"path/filepath"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// layout is where a data root keeps what (see the package comment). Every
// path it builds comes from an id that matches the driver's pattern: it
// panics otherwise, so a missed check is a crash, not an escape.
type layout struct {
	root      string // absolute, symlinks resolved
	volRoot   string
	blockRoot string
	snapRoot  string
	lostRoot  string // unclaimed data moved aside at start, never deleted by the driver
}

func newLayout(root string) layout {
	return layout{
		root:      root,
		volRoot:   filepath.Join(root, "volumes"),
		blockRoot: filepath.Join(root, "block"),
		snapRoot:  filepath.Join(root, "snapshots"),
		lostRoot:  filepath.Join(root, "orphaned"),
	}
}

// volDir is the data directory of a mount volume. It panics on an id that
// does not match the volume id pattern: callers validate first, and a path
// must never be built from anything else.
func (m layout) volDir(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.volRoot, id)
}

// imagePath is the image file of an image volume.
func (m layout) imagePath(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.blockRoot, id+".img")
}

// dataPath is where volume v's data lives.
func (m layout) dataPath(v *contract.Volume) string {
	if v.Image() {
		return m.imagePath(v.ID)
	}
	return m.volDir(v.ID)
}

// snapPath is where snapshot s's data lives.
func (m layout) snapPath(s *contract.Snapshot) string {
	if !contract.ValidSnapshotID(s.ID) {
		panic(fmt.Sprintf("volume: path requested for invalid snapshot id %q", s.ID))
	}
	if s.Image() {
		return filepath.Join(m.snapRoot, s.ID+".img")
	}
	return filepath.Join(m.snapRoot, s.ID)
}

func mustVolumeID(id string) {
	if !contract.ValidVolumeID(id) {
		panic(fmt.Sprintf("volume: path requested for invalid volume id %q", id))
	}
}
