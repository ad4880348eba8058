package driver

import (
	"context"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Store is the node's volumes and snapshots as the driver uses them:
// the Node and Identity services (look up, expand, health, probe) and, in
// all mode, LocalBackend (everything the Controller service asks).
// pkg/volume's Store implements it.
type Store interface {
	Root() string
	Probe() error
	Close() error
	Capacity() (contract.CapacityInfo, error)

	LookupByName(name string) (*contract.Volume, error)
	Get(id string) (*contract.Volume, error)
	Resolve(id string) (*contract.Volume, error)
	List(after string, limit int) ([]*contract.Volume, string, error)
	Create(spec contract.CreateSpec) (*contract.Volume, error)
	Delete(id string) error
	Expand(id string, newSize int64) (int64, error)
	Modify(id string, params map[string]string) (*contract.Volume, error)
	Health(id string) (contract.Health, error)

	LookupSnapshotByName(name string) (*contract.Snapshot, error)
	GetSnapshot(id string) (*contract.Snapshot, error)
	ListSnapshots(after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error)
	CreateSnapshot(spec contract.SnapshotSpec) (*contract.Snapshot, error)
	DeleteSnapshot(id string) error

	CreateGroupSnapshot(name string, sourceIDs []string) (*contract.GroupSnapshot, error)
	GetGroupSnapshot(id string, snapshotIDs []string) (*contract.GroupSnapshot, error)
	DeleteGroupSnapshot(id string, snapshotIDs []string) error
}

// Publisher is the node side the Node service drives: what stage, publish
// and their undoing mount, usage figures, node expansion, and the I/O
// limits kept on the pods' cgroups. pkg/publish's Publisher implements it.
type Publisher interface {
	Stage(id, stagingPath string, accessType contract.AccessType, flags []string) error
	Unstage(ctx context.Context, id, stagingPath string) error
	Publish(id string, o contract.PublishOptions) error
	PublishEphemeral(spec contract.CreateSpec, o contract.PublishOptions) error
	Unpublish(ctx context.Context, id, targetPath string) error
	Stats(id, volumePath string) (contract.Usage, error)
	NodeExpand(id, volumePath string) (int64, error)
	// RunIOLimits keeps the I/O limits on the pods' cgroups until ctx ends.
	RunIOLimits(ctx context.Context)
}
