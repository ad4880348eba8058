package harness

import (
	"context"
	"os"
)

// FloorDriverName is the CSI driver name of the stand-in driver of
// tests/e2e/floor (the provisioner of its StorageClasses).
const FloorDriverName = "floor.localdir.test"

// StartFloor starts the stand-in driver of `make bench-cluster`, whose
// CreateVolume and DeleteVolume answer at once, behind a csi-provisioner
// with the arguments deploy/ gives localdir's (API client rate, timeout,
// metadata; not capacity tracking, which the stand-in does not offer, nor
// leader election), as the admin user. Binding PVCs of its
// StorageClasses measures what the control plane alone costs. Down stops
// both with everything else.
func (c *Cluster) StartFloor(ctx context.Context) error {
	if c.Running("floor") {
		return nil
	}
	sock := c.path("floor", "csi.sock")
	if err := os.MkdirAll(c.path("floor"), 0o755); err != nil {
		return err
	}
	if _, err := c.start("floor", nil, nil, c.tool("floor"), "--socket="+sock); err != nil {
		return err
	}
	if err := c.waitSocket(ctx, "floor", "the stand-in driver", sock); err != nil {
		return err
	}
	_, err := c.start("floor-provisioner", nil, []string{"NAMESPACE=default", "POD_NAME=floor-e2e"}, c.tool("csi-provisioner"),
		"--csi-address="+sock, "--kubeconfig="+c.Kubeconfig, "--v=1", "--leader-election=false",
		"--timeout=60s", "--extra-create-metadata", "--kube-api-qps=100", "--kube-api-burst=200")
	return err
}
