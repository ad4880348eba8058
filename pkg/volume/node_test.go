package volume

import (
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// idleNode is a node side on which no volume is mounted, attached or used
// by a pod: what the Store's unit tests run with (no root, no mounts).
type idleNode struct{}

func (idleNode) CheckUnused(*contract.Volume) error { return nil }
func (idleNode) Freeze(*contract.Volume) (func() error, error) {
	return func() error { return nil }, nil
}
func (idleNode) FreezeGroup([]*contract.Volume) (func() error, error) {
	return func() error { return nil }, nil
}
func (idleNode) Refresh(string) error       { return nil }
func (idleNode) Detach(string) error        { return nil }
func (idleNode) InUse(string) (bool, error) { return false, nil }
func (idleNode) ApplyMutable(*contract.Volume, contract.Mutable, map[string]string) error {
	return nil
}
func (idleNode) HoldKey(fscrypt.Identifier) (func(), bool, error) { return nil, false, nil }
