package cases

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C31: a missing or malformed required field is INVALID_ARGUMENT, checked
// before any lookup: the requests name ids the driver does not know, so a
// lookup first would answer NOT_FOUND. Nothing is created or mounted.
//
// Not covered here (mount volumes, core RPCs only): CreateSnapshot without
// name or source and DeleteSnapshot without id belong to the snapshots
// feature; ControllerExpandVolume without id and NodeExpandVolume without
// path to the expansion feature.
func TestC31MissingRequiredFields(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 64 * csitest.Mi })
	dir := in.Dir
	staging := csitest.Mkdir(t, filepath.Join(dir, "S"))
	target := filepath.Join(dir, "T")
	noMode := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	unknownMode := csitest.MntCap()
	unknownMode.AccessMode.Mode = csi.VolumeCapability_AccessMode_UNKNOWN
	noType := &csi.VolumeCapability{AccessMode: csitest.MntCap().AccessMode}
	caps := []*csi.VolumeCapability{csitest.MntCap()}
	before := available(t, in)

	for _, tc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"CreateVolume without name", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{VolumeCapabilities: caps})
			return err
		}},
		{"CreateVolume with empty caps", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: "c31"})
			return err
		}},
		{"CreateVolume with access_mode UNKNOWN", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: "c31", VolumeCapabilities: []*csi.VolumeCapability{unknownMode}})
			return err
		}},
		{"CreateVolume without access_mode", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: "c31", VolumeCapabilities: []*csi.VolumeCapability{noMode}})
			return err
		}},
		{"CreateVolume without access_type", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: "c31", VolumeCapabilities: []*csi.VolumeCapability{noType}})
			return err
		}},
		{"CreateVolume with a 129-byte name", func(c context.Context) error {
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: strings.Repeat("n", 129), VolumeCapabilities: caps})
			return err
		}},
		{"CreateVolume with a control character in the name", func(c context.Context) error {
			// U+0001 is banned by the CSI spec; tab, LF and CR are not (C49).
			_, err := in.Controller.CreateVolume(c, &csi.CreateVolumeRequest{Name: "a\x01b", VolumeCapabilities: caps})
			return err
		}},
		{"DeleteVolume without id", func(c context.Context) error {
			_, err := in.Controller.DeleteVolume(c, &csi.DeleteVolumeRequest{})
			return err
		}},
		{"ValidateVolumeCapabilities without caps", func(c context.Context) error {
			_, err := in.Controller.ValidateVolumeCapabilities(c, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: unknownID})
			return err
		}},
		{"ValidateVolumeCapabilities without id", func(c context.Context) error {
			_, err := in.Controller.ValidateVolumeCapabilities(c, &csi.ValidateVolumeCapabilitiesRequest{VolumeCapabilities: caps})
			return err
		}},
		{"ControllerGetVolume without id", func(c context.Context) error {
			_, err := in.Controller.ControllerGetVolume(c, &csi.ControllerGetVolumeRequest{})
			return err
		}},
		{"ListVolumes with negative max_entries", func(c context.Context) error {
			_, err := in.Controller.ListVolumes(c, &csi.ListVolumesRequest{MaxEntries: -1})
			return err
		}},
		{"NodeStageVolume without id", func(c context.Context) error {
			_, err := in.Node.NodeStageVolume(c, &csi.NodeStageVolumeRequest{StagingTargetPath: staging, VolumeCapability: csitest.MntCap()})
			return err
		}},
		{"NodeStageVolume without staging path", func(c context.Context) error {
			_, err := in.Node.NodeStageVolume(c, &csi.NodeStageVolumeRequest{VolumeId: unknownID, VolumeCapability: csitest.MntCap()})
			return err
		}},
		{"NodeStageVolume without capability", func(c context.Context) error {
			_, err := in.Node.NodeStageVolume(c, &csi.NodeStageVolumeRequest{VolumeId: unknownID, StagingTargetPath: staging})
			return err
		}},
		{"NodeStageVolume with access_mode UNKNOWN", func(c context.Context) error {
			_, err := in.Node.NodeStageVolume(c, &csi.NodeStageVolumeRequest{VolumeId: unknownID, StagingTargetPath: staging, VolumeCapability: unknownMode})
			return err
		}},
		{"NodeStageVolume with a relative staging path", func(c context.Context) error {
			_, err := in.Node.NodeStageVolume(c, &csi.NodeStageVolumeRequest{VolumeId: unknownID, StagingTargetPath: "relative/s", VolumeCapability: csitest.MntCap()})
			return err
		}},
		{"NodeUnstageVolume without id", func(c context.Context) error {
			_, err := in.Node.NodeUnstageVolume(c, &csi.NodeUnstageVolumeRequest{StagingTargetPath: staging})
			return err
		}},
		{"NodeUnstageVolume without staging path", func(c context.Context) error {
			_, err := in.Node.NodeUnstageVolume(c, &csi.NodeUnstageVolumeRequest{VolumeId: unknownID})
			return err
		}},
		{"NodePublishVolume without id", func(c context.Context) error {
			req := publishReq("", staging, target)
			_, err := in.Node.NodePublishVolume(c, req)
			return err
		}},
		{"NodePublishVolume without target", func(c context.Context) error {
			_, err := in.Node.NodePublishVolume(c, publishReq(unknownID, staging, ""))
			return err
		}},
		{"NodePublishVolume without capability", func(c context.Context) error {
			req := publishReq(unknownID, staging, target)
			req.VolumeCapability = nil
			_, err := in.Node.NodePublishVolume(c, req)
			return err
		}},
		{"NodePublishVolume with a relative target", func(c context.Context) error {
			_, err := in.Node.NodePublishVolume(c, publishReq(unknownID, staging, "relative/t"))
			return err
		}},
		{"NodePublishVolume with a relative staging path", func(c context.Context) error {
			_, err := in.Node.NodePublishVolume(c, publishReq(unknownID, "relative/s", target))
			return err
		}},
		{"NodeUnpublishVolume without target", func(c context.Context) error {
			_, err := in.Node.NodeUnpublishVolume(c, &csi.NodeUnpublishVolumeRequest{VolumeId: "unknown"})
			return err
		}},
		{"NodeUnpublishVolume without id", func(c context.Context) error {
			_, err := in.Node.NodeUnpublishVolume(c, &csi.NodeUnpublishVolumeRequest{TargetPath: target})
			return err
		}},
		{"NodeUnpublishVolume with a relative target", func(c context.Context) error {
			_, err := in.Node.NodeUnpublishVolume(c, &csi.NodeUnpublishVolumeRequest{VolumeId: "unknown", TargetPath: "relative/t"})
			return err
		}},
		{"NodeGetVolumeStats without path", func(c context.Context) error {
			_, err := in.Node.NodeGetVolumeStats(c, &csi.NodeGetVolumeStatsRequest{VolumeId: unknownID})
			return err
		}},
		{"NodeGetVolumeStats without id", func(c context.Context) error {
			_, err := in.Node.NodeGetVolumeStats(c, &csi.NodeGetVolumeStatsRequest{VolumePath: target})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			csitest.CodeIs(t, tc.call(csitest.Ctx(t)), codes.InvalidArgument, tc.name)
			assertListMatchesDisk(t, in)
			csitest.AssertGone(t, target)
			csitest.AssertGone(t, filepath.Join(dir, "relative"))
			if ms := csitest.MountsUnder(t, dir); len(ms) != 0 {
				t.Errorf("%d mount(s) under %s after a refused call", len(ms), dir)
			}
		})
	}
	if got := available(t, in); got != before {
		t.Errorf("available capacity changed %d -> %d", before, got)
	}
}

// C32: NodeGetVolumeStats is NOT_FOUND for an unknown volume and for a
// volume_path that is relative, missing or shows something else; for a
// mount volume it reports the volume's own usage (used ≥ what was written)
// against its size, not the host filesystem's numbers.
//
// Total is the provisioned size and available = total − used, never
// negative (see the Usage doc comment in pkg/volume/stats.go). On the dir
// engine (any filesystem without quotas, such as the ext4 of t.TempDir here)
// capacity is tracked, not enforced, so a volume can be over-full; an engine
// that enforces it must refuse the write instead (EDQUOT/ENOSPC). The
// INODES entry is checked when the driver reports one (the dir engine
// does).
//
// Not covered here (mount volumes only): the block half ({X, T} on a 4Mi blk
// volume: BYTES total 4194304) belongs to the raw block feature.
func TestC32NodeGetVolumeStats(t *testing.T) {
	in := testdriver.Start(t, nil)
	dir := in.Dir
	m := createVolume(t, in, "c32", 4*csitest.Mi).GetVolumeId()
	other := createVolume(t, in, "c32-other", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(dir, "S"))
	target := filepath.Join(dir, "T")
	stage(t, in, m, staging)
	publish(t, in, m, staging, target)
	otherStaging := csitest.Mkdir(t, filepath.Join(dir, "S-other"))
	stage(t, in, other, otherStaging)
	notMounted := csitest.Mkdir(t, filepath.Join(dir, "plain"))

	for _, tc := range []struct {
		name, id, path string
	}{
		{"unknown volume, relative path", "unknown", "some/path"},
		{"unknown well-formed id, relative path", unknownID, "some/path"},
		{"unknown volume, real mount", unknownID, target},
		{"known volume, relative path", m, "some/path"},
		{"known volume, missing path", m, filepath.Join(dir, "missing")},
		{"known volume, directory that is not its mount", m, notMounted},
		{"known volume, another volume's mount", m, otherStaging},
		{"known volume, the data root", m, in.Opts.DataRoot},
	} {
		_, err := in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: tc.id, VolumePath: tc.path})
		csitest.CodeIs(t, err, codes.NotFound, "NodeGetVolumeStats "+tc.name)
	}

	stats := func(p string) (bytes, inodes *csi.VolumeUsage) {
		t.Helper()
		resp, err := in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: m, VolumePath: p})
		csitest.MustCode(t, err, codes.OK, "NodeGetVolumeStats at "+p)
		for _, u := range resp.GetUsage() {
			switch u.GetUnit() {
			case csi.VolumeUsage_BYTES:
				bytes = u
			case csi.VolumeUsage_INODES:
				inodes = u
			}
		}
		if bytes == nil {
			t.Fatalf("NodeGetVolumeStats at %s: usage %v lacks a BYTES entry", p, resp.GetUsage())
		}
		return bytes, inodes
	}

	emptyBytes, emptyInodes := stats(target)
	if emptyBytes.GetTotal() != 4*csitest.Mi || emptyBytes.GetUsed() >= 64*csitest.Ki || emptyBytes.GetAvailable() != 4*csitest.Mi-emptyBytes.GetUsed() {
		t.Errorf("empty volume: bytes %v, want total 4Mi, used < 64Ki, available = total - used", emptyBytes)
	}

	writeFileSynced(t, filepath.Join(target, "one-mib"), csitest.RandomBytes(32, int(csitest.Mi)))
	for _, p := range []string{target, staging} {
		b, i := stats(p)
		if b.GetTotal() != 4*csitest.Mi {
			t.Errorf("%s: total %d, want the volume size %d", p, b.GetTotal(), 4*csitest.Mi)
		}
		if b.GetUsed() < csitest.Mi || b.GetUsed() > csitest.Mi+64*csitest.Ki {
			t.Errorf("%s: used %d after writing 1Mi, want in [1Mi, 1Mi+64Ki] (the volume's own usage)", p, b.GetUsed())
		}
		if b.GetAvailable() != b.GetTotal()-b.GetUsed() {
			t.Errorf("%s: available %d, want total - used = %d", p, b.GetAvailable(), b.GetTotal()-b.GetUsed())
		}
		if (i == nil) != (emptyInodes == nil) {
			t.Errorf("%s: INODES entry reported %v, before the write %v", p, i, emptyInodes)
		} else if i != nil {
			if i.GetUsed() != emptyInodes.GetUsed()+1 {
				t.Errorf("%s: inodes used %d, want %d (one file more)", p, i.GetUsed(), emptyInodes.GetUsed()+1)
			}
			if i.GetTotal() != i.GetUsed()+i.GetAvailable() {
				t.Errorf("%s: inodes total %d != used %d + available %d", p, i.GetTotal(), i.GetUsed(), i.GetAvailable())
			}
		}
	}

	// Past its size: available is 0, never negative.
	err := os.WriteFile(filepath.Join(target, "four-mib"), csitest.RandomBytes(33, int(4*csitest.Mi)), 0o644)
	b, _ := stats(target)
	switch {
	case err == nil:
		if b.GetUsed() < 5*csitest.Mi || b.GetAvailable() != 0 || b.GetTotal() != 4*csitest.Mi {
			t.Errorf("over-full volume: bytes %v, want used >= 5Mi, available 0, total 4Mi", b)
		}
	case errors.Is(err, syscall.EDQUOT) || errors.Is(err, syscall.ENOSPC):
		if b.GetUsed() > b.GetTotal() || b.GetAvailable() < 0 || b.GetTotal() != 4*csitest.Mi {
			t.Errorf("volume with enforced capacity: bytes %v, want used <= total = 4Mi", b)
		}
	default:
		t.Fatalf("write past the volume size: %v", err)
	}

	unpublish(t, in, m, target)
	_, err = in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: m, VolumePath: target})
	csitest.CodeIs(t, err, codes.NotFound, "NodeGetVolumeStats after unpublish")
	unstage(t, in, m, staging)
	unstage(t, in, other, otherStaging)
	deleteVolume(t, in, m)
	deleteVolume(t, in, other)
}
