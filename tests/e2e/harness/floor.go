package harness

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FloorDriverName is the CSI driver name of the stand-in driver of
// tests/e2e/floor (the provisioner of its StorageClasses).
const FloorDriverName = "floor.localdir.test"

// StartFloor starts the stand-in driver of `make bench-cluster`, whose
// CreateVolume and DeleteVolume answer at once, behind a csi-provisioner
// with the arguments deploy/ gives localdir's (API client rate, timeout,
// metadata; not capacity tracking, which the stand-in does not offer, nor
// leader election), as the admin user; and on every node, in the node's
// namespaces, its Node service (NodePublishVolume makes the target
// directory) registered with the kubelet by the registrar stand-in, so
// pods of its volumes start as localdir's do. Binding PVCs of its
// StorageClasses measures what the control plane and the kubelet alone
// cost. Down stops them all with everything else.
func (c *Cluster) StartFloor(ctx context.Context) error {
	for _, n := range c.Nodes {
		if err := n.startFloor(ctx); err != nil {
			return err
		}
	}
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

// startFloor starts the stand-in's Node service on the node and its
// registration (unless they run), and waits until the node's CSINode
// lists the stand-in.
func (n *Node) startFloor(ctx context.Context) error {
	c := n.c
	sock := "/var/lib/kubelet/plugins/" + FloorDriverName + "/csi.sock"
	if err := os.MkdirAll(n.Path(filepath.Dir(sock)), 0o755); err != nil {
		return err
	}
	if name := n.proc("floor-node"); !c.Running(name) {
		if _, err := c.start(name, n, nil, c.tool("floor"), "--socket="+sock, "--node-id="+n.Name); err != nil {
			return err
		}
		if err := c.waitSocket(ctx, name, "the stand-in's node service on "+n.Name, n.Path(sock)); err != nil {
			return err
		}
	}
	if name := n.proc("floor-registrar"); !c.Running(name) {
		if _, err := c.start(name, n, nil, c.tool("registrar"), "--csi-address="+sock,
			"--kubelet-registration-path="+sock, "--plugin-registration-dir=/var/lib/kubelet/plugins_registry"); err != nil {
			return err
		}
	}
	return c.waitFor(ctx, "CSINode "+n.Name+" lists "+FloorDriverName, time.Minute, func() (bool, error) {
		out, err := c.Kubectl(ctx, "", "get", "csinode", n.Name, "-o", "jsonpath={.spec.drivers[*].name}")
		return err == nil && strings.Contains(out, FloorDriverName), nil
	})
}
