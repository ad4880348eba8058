package cluster

import (
	"io"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// NodeStore is the node's volumes as the node agent uses them (pkg/volume's
// Store); the controller side never uses it.
type NodeStore interface {
	Get(id string) (*contract.Volume, error)
	List(after string, limit int) ([]*contract.Volume, string, error)
	Create(spec contract.CreateSpec) (*contract.Volume, error)
	// Receive creates spec's volume from the stream of another node's Send.
	Receive(spec contract.CreateSpec, r io.Reader, progress func(done, total int64)) (*contract.Volume, error)
	Delete(id string) error
	Expand(id string, newSize int64) (int64, error)
	Modify(id string, params map[string]string) (*contract.Volume, error)
	DataPath(v *contract.Volume) string

	Capacity() (contract.CapacityInfo, error)
	Engine() contract.Engine
	Leftovers() []contract.Leftover
}

// NodeSnapshots is the node's snapshots as the node agent carries them
// out: pkg/volume's Snapshots implements it.
type NodeSnapshots interface {
	Get(id string) (*contract.Snapshot, error)
	List(after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error)
	Create(spec contract.SnapshotSpec) (*contract.Snapshot, error)
	Delete(id string) error
	Receive(s contract.Snapshot, base string, r io.Reader, progress func(done, total int64)) (*contract.Snapshot, error)
	Path(s *contract.Snapshot) string
	CreateGroupWithIDs(name string, sourceIDs, snapshotIDs []string) (*contract.GroupSnapshot, error)
}
