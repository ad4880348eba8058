package volume

import (
	"fmt"
	"path/filepath"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// layout is where a data root keeps what. Every path comes from an id of the
// driver's pattern: it panics otherwise, so a missed check is a crash, not an
// escape.
type layout struct {
	root      string // absolute, symlinks resolved
	volRoot   string
	blockRoot string
	snapRoot  string
	lostRoot  string // unclaimed data moved aside at start, never deleted by the driver
	sendRoot  string // point-in-time copies of volumes being sent to another node (Send)
}

func newLayout(root string) layout {
	return layout{
		root:      root,
		volRoot:   filepath.Join(root, "volumes"),
		blockRoot: filepath.Join(root, "block"),
		snapRoot:  filepath.Join(root, "snapshots"),
		lostRoot:  filepath.Join(root, "orphaned"),
		sendRoot:  filepath.Join(root, "sending"),
	}
}

func (m layout) volDir(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.volRoot, id)
}

func (m layout) imagePath(id string) string {
	mustVolumeID(id)
	return filepath.Join(m.blockRoot, id+".img")
}

func (m layout) dataPath(v *contract.Volume) string {
	if v.Image() {
		return m.imagePath(v.ID)
	}
	return m.volDir(v.ID)
}

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
