package multinode

import (
	"bytes"
	"context"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
)

// TestSnapshotMetadataThroughTheController: the controller serves the
// SnapshotMetadata service for snapshots on node-0, asking node-0's plugin
// over the node-to-node channel with the certificate it published in the
// ConfigMap localdir-controller-certificates (which no node plugin may
// write). A raw block volume is changed between two snapshots (new data,
// rewrites, holes punched as a discard does); the ranges GetMetadataDelta
// names rebuild the second snapshot from the first byte for byte, in
// messages of at most max_results, and GetMetadataAllocated's rebuild it
// from zeros. A directory volume's snapshot is FAILED_PRECONDITION, an
// unknown one NOT_FOUND; with node-0's plugin stopped the call is
// UNAVAILABLE (retried), never a partial answer.
func TestSnapshotMetadataThroughTheController(t *testing.T) {
	c := startTransferNodes(t, 1<<30, 1<<30)
	ctx := context.Background()
	pin := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}

	caps, err := c.ctrl.Identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	advertised := false
	for _, cp := range caps.GetCapabilities() {
		advertised = advertised || cp.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
	}
	if !advertised {
		t.Fatal("the controller does not advertise SNAPSHOT_METADATA_SERVICE")
	}
	// The certificates are the controller's alone to write.
	nodeClient, err := client.New(c.env.NodeIdentity(t, "node-1").Config, client.Options{Scheme: lcluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := nodeClient.Get(ctx, client.ObjectKey{Namespace: "localdir", Name: lcluster.ControllerCertsConfigMap}, cm); err != nil || len(cm.Data) != 1 {
		t.Fatalf("the node plugin reads the controller's certificates: %d entries, %v", len(cm.Data), err)
	}
	cm.Data["forged"] = "-----BEGIN CERTIFICATE-----"
	if err := nodeClient.Update(ctx, cm); !apierrors.IsForbidden(err) {
		t.Fatalf("a node plugin's update of the controller's certificates: %v, want forbidden", err)
	}

	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: "cbt", VolumeCapabilities: blk, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi}, AccessibilityRequirements: pin,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	root := c.nodes["node-0"].Opts.DataRoot
	img, err := os.OpenFile(filepath.Join(root, "block", id+".img"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	r := rand.New(rand.NewSource(3))
	change := func(n int) {
		for range n {
			off := r.Int63n(64*mi/4096) * 4096
			l := min(int64(1+r.Intn(256))*4096, 64*mi-off)
			if r.Intn(4) == 0 {
				if err := unix.Fallocate(int(img.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, l); err != nil {
					t.Fatal(err)
				}
				continue
			}
			b := make([]byte, l)
			r.Read(b)
			if _, err := img.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
		}
		if err := img.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	snap := func(name, vol string) string {
		s, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: vol})
		if err != nil {
			t.Fatal(err)
		}
		return s.GetSnapshot().GetSnapshotId()
	}
	change(40)
	s1 := snap("cbt-1", id)
	change(30)
	s2 := snap("cbt-2", id)
	image := func(sid string) []byte {
		b, err := os.ReadFile(filepath.Join(root, "snapshots", sid+".img"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	sm := csi.NewSnapshotMetadataClient(c.ctrl.Conn)
	type stream interface {
		GetVolumeCapacityBytes() int64
		GetBlockMetadata() []*csi.BlockMetadata
	}
	apply := func(got, from []byte, recv func() (stream, error), maxResults int) {
		t.Helper()
		for {
			m, err := recv()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.GetVolumeCapacityBytes() != 64*mi || len(m.GetBlockMetadata()) > maxResults {
				t.Fatalf("a message with capacity %d and %d ranges (max_results %d)", m.GetVolumeCapacityBytes(), len(m.GetBlockMetadata()), maxResults)
			}
			for _, b := range m.GetBlockMetadata() {
				copy(got[b.GetByteOffset():b.GetByteOffset()+b.GetSizeBytes()], from[b.GetByteOffset():b.GetByteOffset()+b.GetSizeBytes()])
			}
		}
	}
	want, base := image(s2), image(s1)
	ds, err := sm.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: s1, TargetSnapshotId: s2, MaxResults: 5})
	if err != nil {
		t.Fatal(err)
	}
	apply(base, want, func() (stream, error) { return ds.Recv() }, 5)
	if !bytes.Equal(base, want) {
		t.Fatal("the second snapshot rebuilt from the first and the delta differs: a changed block was left out")
	}
	got := make([]byte, len(want))
	as, err := sm.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: s2})
	if err != nil {
		t.Fatal(err)
	}
	apply(got, want, func() (stream, error) { return as.Recv() }, 1024)
	if !bytes.Equal(got, want) {
		t.Fatal("the snapshot rebuilt from zeros and its allocated ranges differs")
	}

	code := func(req *csi.GetMetadataAllocatedRequest) codes.Code {
		st, err := sm.GetMetadataAllocated(ctx, req)
		if err == nil {
			_, err = st.Recv()
			for err == nil {
				_, err = st.Recv()
			}
			if err == io.EOF {
				err = nil
			}
		}
		return status.Code(err)
	}
	dir, err := c.create(ctx, "cbt-dir", 8*mi, pin)
	if err != nil {
		t.Fatal(err)
	}
	if got := code(&csi.GetMetadataAllocatedRequest{SnapshotId: snap("cbt-dir-1", dir.GetVolumeId())}); got != codes.FailedPrecondition {
		t.Errorf("a directory volume's snapshot: %v, want FailedPrecondition", got)
	}
	if got := code(&csi.GetMetadataAllocatedRequest{SnapshotId: "snap-0123456789abcdef0123456789abcdef"}); got != codes.NotFound {
		t.Errorf("an unknown snapshot: %v, want NotFound", got)
	}
	c.nodes["node-0"].Stop(t)
	if got := code(&csi.GetMetadataAllocatedRequest{SnapshotId: s2}); got != codes.Unavailable {
		t.Errorf("with the snapshot's node plugin stopped: %v, want Unavailable", got)
	}
}
