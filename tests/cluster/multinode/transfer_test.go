package multinode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

var blk = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

// startTransferNodes is startNodes with the node-to-node channel on
// 127.0.0.1 (a port of the kernel's choosing) on every node.
func startTransferNodes(t testing.TB, capacities ...int64) *fixture {
	return transferNodesOn(t, clustertest.Start(t), capacities...)
}

// transferNodesOn is startTransferNodes against the control plane env.
func transferNodesOn(t testing.TB, env *clustertest.Env, capacities ...int64) *fixture {
	c := &fixture{env: env, nodes: map[string]*clustertest.Plugin{}}
	for i, capBytes := range capacities {
		name := fmt.Sprintf("node-%d", i)
		c.nodes[name] = env.StartNode(t, name, func(o *driver.Options) {
			o.CapacityBytes = capBytes
			o.TransferAddress = "127.0.0.1:0"
		})
		env.WaitLocalNode(t, name)
	}
	c.ctrl = env.StartController(t, nil)
	return c
}

// TestRestoreAndCloneOntoAnotherNode: a snapshot restored and a volume
// cloned onto the other node, as a directory and as a raw block volume,
// arrive byte for byte through the channel; the LocalVolume reports the
// transfer done; the source keeps its data.
func TestRestoreAndCloneOntoAnotherNode(t *testing.T) {
	c := startTransferNodes(t, 200*mi, 200*mi)
	ctx := context.Background()
	pin0 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}
	pin1 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}, Preferred: []*csi.Topology{topologyOf("node-1")}}
	root0, root1 := c.nodes["node-0"].Opts.DataRoot, c.nodes["node-1"].Opts.DataRoot
	for _, kind := range []struct {
		name string
		caps []*csi.VolumeCapability
		path func(root, id string) string
	}{
		{"dir", mnt, func(root, id string) string { return filepath.Join(root, "volumes", id) }},
		{"block", blk, func(root, id string) string { return filepath.Join(root, "block", id+".img") }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
				Name: "src-" + kind.name, VolumeCapabilities: kind.caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * mi}, AccessibilityRequirements: pin0,
			})
			if err != nil {
				t.Fatal(err)
			}
			src := resp.GetVolume()
			data := treecmp.RandomBytes(7, 3*mi+123)
			p := kind.path(root0, src.GetVolumeId())
			if kind.name == "dir" {
				p = filepath.Join(p, "file")
				if err := os.WriteFile(p, data, 0o640); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("file", filepath.Join(filepath.Dir(p), "link")); err != nil {
					t.Fatal(err)
				}
			} else {
				f, err := os.OpenFile(p, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(data, 5*mi); err != nil {
					t.Fatal(err)
				}
				f.Close()
			}
			snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-" + kind.name, SourceVolumeId: src.GetVolumeId()})
			if err != nil {
				t.Fatal(err)
			}
			for _, cs := range []*csi.VolumeContentSource{
				{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}},
				{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}},
			} {
				name := fmt.Sprintf("copy-%s-%v", kind.name, cs.GetSnapshot() != nil)
				start := time.Now()
				resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
					Name: name, VolumeCapabilities: kind.caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 30 * mi},
					VolumeContentSource: cs, AccessibilityRequirements: pin1,
				})
				if err != nil {
					t.Fatalf("%s onto node-1: %v", name, err)
				}
				v := resp.GetVolume()
				if nodeOfVol(v) != "node-1" || v.GetCapacityBytes() != 30*mi {
					t.Fatalf("%s: on %s with %d bytes, want node-1 with 30Mi", name, nodeOfVol(v), v.GetCapacityBytes())
				}
				got := kind.path(root1, v.GetVolumeId())
				if kind.name == "dir" {
					if l, err := os.Readlink(filepath.Join(got, "link")); err != nil || l != "file" {
						t.Errorf("%s: symlink %q, %v", name, l, err)
					}
					got = filepath.Join(got, "file")
					b, err := os.ReadFile(got)
					if err != nil || !bytes.Equal(b, data) {
						t.Errorf("%s: data on node-1 differs (%d bytes, %v)", name, len(b), err)
					}
					if fi, err := os.Stat(got); err != nil || fi.Mode().Perm() != 0o640 {
						t.Errorf("%s: mode %v, %v", name, fi.Mode(), err)
					}
				} else {
					f, err := os.Open(got)
					if err != nil {
						t.Fatal(err)
					}
					b := make([]byte, len(data))
					_, err = f.ReadAt(b, 5*mi)
					fi, _ := f.Stat()
					f.Close()
					if err != nil || !bytes.Equal(b, data) || fi.Size() != 30*mi {
						t.Errorf("%s: image on node-1 differs or is %d bytes (%v)", name, fi.Size(), err)
					}
				}
				lv := &v1.LocalVolume{}
				if err := c.env.Client.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, lv); err != nil {
					t.Fatal(err)
				}
				tr := lv.Status.Transfer
				if lv.Spec.ContentSource.Node != "node-0" || tr == nil || tr.CompletionTime == nil || tr.SourceNode != "node-0" || tr.BytesDone.Value() < int64(len(data)) {
					t.Errorf("%s: spec.contentSource %+v, status.transfer %+v", name, lv.Spec.ContentSource, tr)
				}
				if kind.name == "block" && tr != nil && tr.BytesDone.Value() > 8*mi {
					t.Errorf("%s: %d bytes crossed for a 20Mi image holding about 3Mi", name, tr.BytesDone.Value())
				}
				t.Logf("%s: %s", name, time.Since(start).Round(time.Millisecond))
			}
			// The clone's private copy on node-0 is gone.
			if ents, err := os.ReadDir(filepath.Join(root0, "sending")); err != nil || len(ents) != 0 {
				t.Errorf("sending/ on node-0: %v, %v; want empty", ents, err)
			}
		})
	}
}
