// Package sanity runs the csi-test/v5 sanity suite against localdir in all
// mode, in-process, as root with real bind mounts.
package sanity

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// Specs skipped by csi-sanity because the driver does not advertise their
// capability in this version (csi-sanity skips them itself; none is skipped
// by this test):
//   - snapshots (CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS), cloning
//     (CLONE_VOLUME), expansion (EXPAND_VOLUME), raw block, ephemeral
//     volumes and the CSI 1.13 health RPCs: the data-features issue.
//   - ControllerPublish/Unpublish (PUBLISH_UNPUBLISH_VOLUME): a local volume
//     needs no attach step; cluster mode adds it with the attacher.
//   - LIST_VOLUMES_PUBLISHED_NODES, MODIFY_VOLUME, GET_SNAPSHOT,
//     VOLUME_MOUNT_GROUP, group snapshots: not applicable to local
//     directories (see docs/capabilities.md).
func TestSanityAllModeDir(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) {
		o.CapacityBytes = 8 << 30
	})
	cfg := sanity.NewTestConfig()
	cfg.Address = in.Endpoint
	cfg.TargetPath = filepath.Join(in.Dir, "target")
	cfg.StagingPath = filepath.Join(in.Dir, "staging")
	cfg.TestVolumeSize = 64 << 20
	cfg.IdempotentCount = 3
	sanity.Test(t, cfg)
}
