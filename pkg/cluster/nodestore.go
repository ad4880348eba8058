package cluster

import "github.com/localdir-csi/localdir/pkg/contract"

// NodeStore is the node's volumes and snapshots as the node agent's
// reconcilers and heartbeat carry them out: pkg/volume's Store implements
// it. The controller side of this package never uses it.
type NodeStore interface {
	Get(id string) (*contract.Volume, error)
	List(after string, limit int) ([]*contract.Volume, string, error)
	Create(spec contract.CreateSpec) (*contract.Volume, error)
	Delete(id string) error
	Expand(id string, newSize int64) (int64, error)
	Modify(id string, params map[string]string) (*contract.Volume, error)
	DataPath(v *contract.Volume) string

	GetSnapshot(id string) (*contract.Snapshot, error)
	ListSnapshots(after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error)
	CreateSnapshot(spec contract.SnapshotSpec) (*contract.Snapshot, error)
	DeleteSnapshot(id string) error
	SnapshotPath(s *contract.Snapshot) string
	CreateGroupSnapshotWithIDs(name string, sourceIDs, snapshotIDs []string) (*contract.GroupSnapshot, error)

	Capacity() (contract.CapacityInfo, error)
	Engine() contract.Engine
	Leftovers() []contract.Leftover
}
