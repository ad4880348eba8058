package datacases

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// startDirEngine starts the driver in all mode with the dir engine on a data
// root in a temp dir, and returns it, its options and the temp dir.
func startDirEngine(t *testing.T) (*testdriver.Instance, driver.Options, string) {
	t.Helper()
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.Engine = "dir"
	return testdriver.StartWith(t, o), o, dir
}

// forPod creates a volume with capability c and mutable parameters mut,
// stages it and publishes it below dir for the pod with uid ("": none), as
// the kubelet does with podInfoOnMount; it returns the volume's id and target
// path (unpublished and unstaged when the test ends).
func forPod(t *testing.T, in *testdriver.Instance, dir, name string, c *csi.VolumeCapability, uid string, mut map[string]string) (string, string) {
	t.Helper()
	ctx := context.Background()
	r, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{c},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, MutableParameters: mut})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	stage, target := filepath.Join(dir, name+"-stage"), filepath.Join(dir, name+"-pub")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: c}); err != nil {
		t.Fatal(err)
	}
	var vc map[string]string
	if uid != "" {
		vc = map[string]string{"csi.storage.k8s.io/pod.uid": uid}
	}
	if _, err := in.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: stage, TargetPath: target, VolumeCapability: c,
		VolumeContext: vc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = in.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		_, _ = in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})
	})
	return id, target
}
