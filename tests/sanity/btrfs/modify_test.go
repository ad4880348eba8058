package btrfs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

func mountCap() []*csi.VolumeCapability {
	return []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
}

// A VolumeAttributesClass's parameters over CSI on a btrfs data root:
// CreateVolume's mutable_parameters are in effect on the new volume's data
// (its btrfs compression property, its root's mode), ControllerModifyVolume
// changes only the keys it names, and parameters a volume cannot take are
// INVALID_ARGUMENT and change nothing.
func TestModifyVolume(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.DataRoot = filepath.Join(testfs.New(t, testfs.Btrfs, 1<<30), "data")
	o.Engine = "btrfs"
	in := testdriver.StartWith(t, o)
	ctx := context.Background()
	created, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "vac", VolumeCapabilities: mountCap(),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 16 << 20},
		MutableParameters: map[string]string{"compression": "lzo", "dirMode": "0700"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetVolume().GetVolumeId()
	data := filepath.Join(o.DataRoot, "volumes", id)
	check := func(when, compression string, perm os.FileMode) {
		t.Helper()
		if got, err := engine.Compression(data); err != nil || got != compression {
			t.Errorf("%s: compression property %q (%v), want %q", when, got, err, compression)
		}
		if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != perm {
			t.Errorf("%s: mode of the volume's root %v (%v), want %o", when, fi.Mode().Perm(), err, perm)
		}
	}
	check("created with compression=lzo, dirMode=0700", "lzo", 0o700)
	if _, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: map[string]string{"compression": "zstd"}}); err != nil {
		t.Fatal(err)
	}
	check("modified to compression=zstd", "zstd", 0o700)
	for _, bad := range []map[string]string{{"compression": "brotli"}, {"iops": "100"}, {"dirMode": "0755", "compression": "gzip"}} {
		_, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: bad})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("modify with %v: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	check("after refused modifies", "zstd", 0o700)
	_, err = in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "image", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		MutableParameters: map[string]string{"compression": "zstd"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("an ext4 image volume with compression=zstd: %v, want INVALID_ARGUMENT", err)
	}
}
