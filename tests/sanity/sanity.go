// Package sanity runs the csi-test/v5 sanity suite against localdir in all
// mode, in-process, as root with real mounts. Ginkgo runs one suite per
// process, so each configuration is its own test package below this one:
//
//	dir/         dir engine on the machine's disk, mount volumes
//	xfsreflink/  dir engine on a loop-mounted XFS made with reflink=1
//	btrfs/       btrfs engine on a loop-mounted btrfs with qgroups
//	block/       raw block volumes (TestVolumeAccessType: block)
//
// Every capability the driver implements is advertised, so csi-sanity skips
// only specs for capabilities it deliberately does not advertise:
//   - PUBLISH_UNPUBLISH_VOLUME (ControllerPublish/Unpublish): a local
//     directory needs no attach step.
//   - LIST_VOLUMES_PUBLISHED_NODES, PUBLISH_READONLY: no controller publish.
//   - MODIFY_VOLUME (VolumeAttributesClass): no mutable parameters.
//   - VOLUME_MOUNT_GROUP: kubelet applies fsGroup (CSIDriver fsGroupPolicy:
//     File).
//   - Group snapshots (GroupController service): not implemented.
//   - NodeGetInfo max_volumes_per_node attach-limit test
//     (TestNodeVolumeAttachLimit): the limit is unlimited by default.
package sanity

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// Config selects the filesystem under the data root and the access type.
type Config struct {
	// FS is "" for the machine's disk, else a testfs kind.
	FS string
	// Engine is the --engine value.
	Engine string
	// Block runs the suite with block volumes.
	Block bool
}

// Run starts the driver for cfg and runs csi-sanity against it.
func Run(t *testing.T, cfg Config) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	base := dir
	if cfg.FS != "" {
		base = testfs.New(t, cfg.FS, 1<<30)
	}
	o := testdriver.DefaultOptions(dir)
	o.DataRoot = filepath.Join(base, "data")
	o.Engine = cfg.Engine
	o.CapacityBytes = 768 << 20
	in := testdriver.StartWith(t, o)
	var _ driver.Options = in.Opts
	sc := sanity.NewTestConfig()
	sc.Address = in.Endpoint
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeSize = 16 << 20
	sc.TestVolumeExpandSize = 32 << 20
	sc.IdempotentCount = 3
	if cfg.Block {
		sc.TestVolumeAccessType = "block"
	}
	sanity.Test(t, sc)
}
