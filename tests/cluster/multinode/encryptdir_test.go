package multinode

import (
	"bytes"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// TestEncryptedDirectoryVolumeInCluster: in cluster mode an encrypted
// directory volume is made on a node whose data root can encrypt (ext4
// with the encrypt feature) and refused, with the reason, on one whose
// data root cannot; staged with its Secret it is encrypted and writable;
// its snapshot restores on its node with its key, and not onto another
// node (a transfer would need the key there); the unstage locks it.
func TestEncryptedDirectoryVolumeInCluster(t *testing.T) {
	env := clustertest.Start(t)
	c := &fixture{env: env, nodes: map[string]*clustertest.Plugin{}}
	cryptRoot := filepath.Join(testfs.New(t, testfs.Ext4Crypt, 512*mi), "data")
	for _, n := range []string{"node-0", "node-1"} {
		c.nodes[n] = env.StartNode(t, n, func(o *driver.Options) {
			o.CapacityBytes = 200 * mi
			o.TransferAddress = "127.0.0.1:0"
			if n == "node-0" {
				o.DataRoot = cryptRoot
			}
		})
		env.WaitLocalNode(t, n)
	}
	c.ctrl = env.StartController(t, nil)
	ctx := context.Background()
	pin := func(n string) *csi.TopologyRequirement {
		return &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf(n)}, Preferred: []*csi.Topology{topologyOf(n)}}
	}
	params := map[string]string{"encryption": "fscrypt"}
	create := func(name, node string, src *csi.VolumeContentSource) (*csi.Volume, error) {
		r, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: name, VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * mi},
			Parameters: params, VolumeContentSource: src, AccessibilityRequirements: pin(node),
		})
		return r.GetVolume(), err
	}

	if _, err := create("on-plain-root", "node-1", nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an encrypted directory volume on a data root that cannot encrypt: %v; want InvalidArgument", err)
	}
	v, err := create("encrypted", "node-0", nil)
	if err != nil {
		t.Fatal(err)
	}
	node := c.nodes["node-0"].Node
	secrets := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(5, 32))}
	staging := csitest.Mkdir(t, filepath.Join(t.TempDir(), "staging"))
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging,
		VolumeCapability: mnt[0], Secrets: secrets}); err != nil {
		t.Fatal(err)
	}
	unstage := func() {
		t.Helper()
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	defer unstage()
	data := csitest.RandomBytes(6, 1<<20)
	if err := os.WriteFile(filepath.Join(staging, "file"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cryptRoot, "volumes", v.GetVolumeId())
	kid, ok, err := fscrypt.Policy(dir)
	if err != nil || !ok {
		t.Fatalf("the staged volume's directory has no policy: %v", err)
	}

	snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "encrypted-snap", SourceVolumeId: v.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	from := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}}
	r, err := create("restored", "node-0", from)
	if err != nil {
		t.Fatalf("restore on the volume's node: %v", err)
	}
	rdir := filepath.Join(cryptRoot, "volumes", r.GetVolumeId())
	if rid, ok, err := fscrypt.Policy(rdir); err != nil || !ok || rid != kid {
		t.Fatalf("the restore's policy: %v, same key %v, %v; want the source's key", ok, rid == kid, err)
	}
	if b, err := os.ReadFile(filepath.Join(rdir, "file")); err != nil || !bytes.Equal(b, data) {
		t.Fatalf("the restore's data: %d bytes, %v", len(b), err)
	}
	_, err = create("restored-elsewhere", "node-1", from)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a restore onto another node: %v; want FailedPrecondition", err)
	}
	if left, _ := os.ReadDir(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "volumes")); len(left) != 0 {
		t.Fatalf("the refused restore left %d entries on node-1", len(left))
	}

	unstage()
	if st, err := fscrypt.Status(cryptRoot, kid); err != nil || st != fscrypt.KeyAbsent {
		t.Fatalf("key %s, %v after the unstage; want absent", st, err)
	}
	if _, err := os.ReadFile(filepath.Join(rdir, "file")); err == nil {
		t.Fatal("a file of the locked restore reads")
	}
	unstage = func() {}
}
