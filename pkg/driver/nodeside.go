package driver

import (
	"context"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Node is what a node- or all-mode driver works on; pkg/app opens it
// (OpenNode).
type Node struct {
	Volumes   Volumes
	Snapshots Snapshots
	Publisher Publisher
}

// Volumes is the node's volumes as the driver uses them (Node and Identity
// services; in all mode LocalBackend); pkg/volume's Store implements it.
type Volumes interface {
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
}

// Snapshots is the node's snapshots and volume group snapshots, for
// LocalBackend in all mode. pkg/volume's Snapshots implements it.
type Snapshots interface {
	LookupByName(name string) (*contract.Snapshot, error)
	Get(id string) (*contract.Snapshot, error)
	List(after string, limit int, sourceVolumeID string) ([]*contract.Snapshot, string, error)
	Create(spec contract.SnapshotSpec) (*contract.Snapshot, error)
	Delete(id string) error

	CreateGroup(name string, sourceIDs []string) (*contract.GroupSnapshot, error)
	GetGroup(id string, snapshotIDs []string) (*contract.GroupSnapshot, error)
	DeleteGroup(id string, snapshotIDs []string) error

	// Ranges yields the block ranges of image snapshot targetID from start
	// that hold data (baseID "") or may differ from snapshot baseID's.
	Ranges(baseID, targetID string, start int64, yield func(off, n int64) error) error
}

// Publisher is the node side the Node service drives; pkg/publish's
// Publisher implements it.
type Publisher interface {
	Stage(id, stagingPath string, accessType contract.AccessType, flags []string, secrets map[string]string) error
	Unstage(ctx context.Context, id, stagingPath string) error
	Publish(id string, o contract.PublishOptions) error
	PublishEphemeral(spec contract.CreateSpec, o contract.PublishOptions) error
	Unpublish(ctx context.Context, id, targetPath string) error
	Stats(id, volumePath string) (contract.Usage, error)
	NodeExpand(id, volumePath string) (int64, error)
	// RunIOLimits keeps the I/O limits on the pods' cgroups until ctx ends.
	RunIOLimits(ctx context.Context)
}
