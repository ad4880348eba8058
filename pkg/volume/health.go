package volume

import (
	"fmt"
	"os"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Health checks volume id's data: missing data (DataLoss), and for the dir
// engine usage beyond the capacity (Degraded). Errors: contract.ErrNotFound.
func (m *Store) Health(id string) (contract.Health, error) {
	v, err := m.Resolve(id)
	if err != nil {
		return contract.Health{}, err
	}
	var h contract.Health
	p := m.dataPath(v)
	fi, err := os.Lstat(p)
	if err != nil {
		h.Problems = append(h.Problems, contract.Problem{Kind: "DataLoss", Reason: "DataMissing", Message: fmt.Sprintf("volume data %s is missing: %v", p, err)})
		return h, nil
	}
	if v.Image() {
		if fi.Size() < v.CapacityBytes {
			h.Problems = append(h.Problems, contract.Problem{Kind: "Degraded", Reason: "ImageTooSmall", Message: fmt.Sprintf("image is %d bytes, volume size is %d", fi.Size(), v.CapacityBytes)})
		}
		return h, nil
	}
	if !m.eng.Enforced() || v.Engine == engine.Dir {
		used, _, err := engine.DiskUsage(p)
		if err == nil && used > v.CapacityBytes {
			h.Problems = append(h.Problems, contract.Problem{Kind: "Degraded", Reason: "OverCapacity",
				Message: fmt.Sprintf("volume uses %d bytes, more than its capacity of %d bytes (the dir engine does not enforce capacity)", used, v.CapacityBytes)})
		}
	}
	return h, nil
}
