// Package sanity runs csi-sanity in split mode against a real API server:
// ControllerAddress is a controller-mode driver, Address a node-mode
// driver, meeting only through the LocalVolume/LocalSnapshot/LocalNode
// custom resources. The skip list is the one of all mode (see
// tests/sanity), except that controller mode serves ControllerPublish /
// ControllerUnpublish (csi-attacher may run), so those specs run here.
package sanity

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

func TestSanitySplitMode(t *testing.T) {
	env := clustertest.Start(t)
	node := env.StartNode(t, "node-a", func(o *driver.Options) { o.CapacityBytes = 2 << 30 })
	env.WaitLocalNode(t, "node-a")
	ctrl := env.StartController(t, nil)
	sc := sanity.NewTestConfig()
	sc.Address = node.Endpoint
	sc.ControllerAddress = ctrl.Endpoint
	sc.TargetPath = filepath.Join(node.Dir, "target")
	sc.StagingPath = filepath.Join(node.Dir, "staging")
	sc.TestVolumeSize = 16 << 20
	sc.TestVolumeExpandSize = 32 << 20
	sc.IdempotentCount = 2
	sc.TestVolumeMutableParameters = map[string]string{"dirMode": "0750"}
	sanity.Test(t, sc)
}
