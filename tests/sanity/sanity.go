// Package sanity runs the csi-test/v5 sanity suite against localdir in all
// mode, in-process, as root with real mounts. Ginkgo runs one suite per
// process, so each configuration is its own test package below this one:
//
//	dir/         dir engine on the machine's disk, mount volumes
//	xfsreflink/  dir engine on a loop-mounted XFS made with reflink=1
//	btrfs/       btrfs engine on a loop-mounted btrfs with qgroups
//	block/       raw block volumes (TestVolumeAccessType: block)
//	ext4/        image volumes formatted ext4, data root on ext4
//	xfs/         image volumes formatted xfs, data root on XFS with reflink
//	unprivileged/ dir engine on a temporary directory, mounts pretended by
//	             mount.Fake: no root, no loop devices, no cgroups (make unit)
//
// Each of them holds its csi-sanity run and nothing else. Tests of the same
// features that are not csi-sanity (VolumeAttributesClass parameters,
// group snapshots, I/O limits) are in tests/datacases.
//
// csi-sanity cannot set a capability's fs_type, so the image-volume runs
// give the driver an interceptor (driver.WithInterceptor) that adds it to
// every mount capability a call carries, as external-provisioner and kubelet
// do for a StorageClass with csi.storage.k8s.io/fstype. Their volume size is
// at least the filesystem's minimum (xfs: 300 MiB): the xfs run asks for
// 300 MiB volumes expanded to 320 MiB.
//
// MODIFY_VOLUME runs with Config.MutableParameters, the group controller
// specs in every configuration and in split mode.
//
// Every capability the driver implements is advertised, so csi-sanity skips
// only specs for capabilities it deliberately does not advertise:
//   - PUBLISH_UNPUBLISH_VOLUME (ControllerPublish/Unpublish): a local
//     directory needs no attach step.
//   - LIST_VOLUMES_PUBLISHED_NODES, PUBLISH_READONLY: no controller publish.
//   - VOLUME_MOUNT_GROUP: kubelet applies fsGroup (CSIDriver fsGroupPolicy:
//     File).
//   - NodeGetInfo max_volumes_per_node attach-limit test
//     (TestNodeVolumeAttachLimit): the limit is unlimited by default.
package sanity

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// Config selects the filesystem under the data root and the access type.
type Config struct {
	// FS is "" for the machine's disk, else a testfs kind.
	FS string
	// Engine is the --engine value.
	Engine contract.Engine
	// Block runs the suite with block volumes.
	Block bool
	// FsType makes every volume an image volume with this filesystem.
	FsType string
	// MutableParameters are what the ModifyVolume specs (and CreateVolume
	// with mutable_parameters) pass: ones the configuration's volumes can
	// take.
	MutableParameters map[string]string
	// Unprivileged runs the driver as any user: its node mounts are a
	// mount.Fake's, and it has no cgroup hierarchy (dir engine only).
	Unprivileged bool
}

// Run starts the driver for cfg and runs csi-sanity against it.
func Run(t *testing.T, cfg Config) {
	if !cfg.Unprivileged {
		testdriver.RequireRoot(t)
	}
	dir := testdriver.TempDir(t)
	base := dir
	size := int64(1 << 30)
	if cfg.FsType == "xfs" {
		size = 8 << 30 // room for csi-sanity's volumes of 300 MiB (sparse)
	}
	if cfg.FS != "" {
		base = testfs.New(t, cfg.FS, size)
	}
	o := testdriver.DefaultOptions(dir)
	o.DataRoot = filepath.Join(base, "data")
	o.Engine = cfg.Engine
	o.CapacityBytes = size * 3 / 4
	var with []driver.Option
	if cfg.FsType != "" {
		with = append(with, driver.WithInterceptor(withFsType(cfg.FsType)))
	}
	var m mount.Interface
	if cfg.Unprivileged {
		m, o.CgroupRoot = mount.NewFake(), ""
	}
	in := testdriver.StartWithMounter(t, o, m, with...)
	var _ driver.Options = in.Opts
	sc := sanity.NewTestConfig()
	sc.Address = in.Endpoint
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeSize = 16 << 20
	sc.TestVolumeExpandSize = 32 << 20
	if cfg.FsType == "xfs" {
		// The smallest XFS mkfs.xfs makes, and a bit more.
		sc.TestVolumeSize, sc.TestVolumeExpandSize = 300<<20, 320<<20
	}
	sc.IdempotentCount = 3
	sc.TestVolumeMutableParameters = cfg.MutableParameters
	if cfg.Block {
		sc.TestVolumeAccessType = "block"
	}
	sanity.Test(t, sc)
}

// withFsType sets fs_type on every mount capability of a request that has
// none.
func withFsType(fs string) grpc.UnaryServerInterceptor {
	set := func(caps ...*csi.VolumeCapability) {
		for _, c := range caps {
			if m := c.GetMount(); m != nil && m.FsType == "" {
				m.FsType = fs
			}
		}
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		switch r := req.(type) {
		case *csi.CreateVolumeRequest:
			set(r.GetVolumeCapabilities()...)
		case *csi.ValidateVolumeCapabilitiesRequest:
			set(r.GetVolumeCapabilities()...)
		case *csi.GetCapacityRequest:
			set(r.GetVolumeCapabilities()...)
		case *csi.ControllerPublishVolumeRequest:
			set(r.GetVolumeCapability())
		case *csi.ControllerExpandVolumeRequest:
			set(r.GetVolumeCapability())
		case *csi.NodeStageVolumeRequest:
			set(r.GetVolumeCapability())
		case *csi.NodePublishVolumeRequest:
			set(r.GetVolumeCapability())
		case *csi.NodeExpandVolumeRequest:
			set(r.GetVolumeCapability())
		}
		return handler(ctx, req)
	}
}
