// Package multinode tests cluster mode with three node plugins (separate
// data roots and node ids) and one controller against a real API server.
package multinode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

const mi = 1 << 20

var mnt = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

func topologyOf(n string) *csi.Topology {
	return &csi.Topology{Segments: map[string]string{driver.TopologyKey: n}}
}

type fixture struct {
	env   *clustertest.Env
	ctrl  *clustertest.Plugin
	nodes map[string]*clustertest.Plugin
}

// startNodes runs one controller and a node plugin per capacity (node-0, …).
func startNodes(t *testing.T, capacities ...int64) *fixture {
	env := clustertest.Start(t)
	c := &fixture{env: env, nodes: map[string]*clustertest.Plugin{}}
	for i, capBytes := range capacities {
		name := fmt.Sprintf("node-%d", i)
		c.nodes[name] = env.StartNode(t, name, func(o *driver.Options) { o.CapacityBytes = capBytes })
		env.WaitLocalNode(t, name)
	}
	c.ctrl = env.StartController(t, nil)
	return c
}

func (c *fixture) create(ctx context.Context, name string, size int64, topo *csi.TopologyRequirement) (*csi.Volume, error) {
	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: size},
		AccessibilityRequirements: topo,
	})
	return resp.GetVolume(), err
}

func nodeOfVol(v *csi.Volume) string {
	return v.GetAccessibleTopology()[0].GetSegments()[driver.TopologyKey]
}

func TestSpreadFullNodeAndDataOnTheRightNode(t *testing.T) {
	c := startNodes(t, 100*mi, 300*mi, 200*mi)
	ctx := context.Background()

	// Without topology the node with most room is chosen, so volumes spread.
	counts := map[string]int{}
	var vols []*csi.Volume
	for i := 0; i < 6; i++ {
		v, err := c.create(ctx, fmt.Sprintf("spread-%d", i), 40*mi, nil)
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		counts[nodeOfVol(v)]++
		vols = append(vols, v)
		// The data is on that node's data root, and only there.
		for n, p := range c.nodes {
			_, err := os.Stat(p.Opts.DataRoot + "/volumes/" + v.GetVolumeId())
			if (n == nodeOfVol(v)) != (err == nil) {
				t.Errorf("volume %s placed on %s; data on %s: %v", v.GetVolumeId(), nodeOfVol(v), n, err)
			}
		}
	}
	if len(counts) < 2 {
		t.Errorf("6 volumes all went to %v; want them spread by capacity", counts)
	}

	// node-0 (100Mi) pinned by requisite: 60Mi fits, another 60Mi does not.
	pin := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}
	if _, err := c.create(ctx, "full-1", 60*mi, pin); err != nil && counts["node-0"] == 0 {
		t.Fatalf("first 60Mi on node-0: %v", err)
	}
	_, err := c.create(ctx, "full-2", 90*mi, pin)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("90Mi on a nearly full node-0: %v, want ResourceExhausted", err)
	}
	// Nothing was recorded for the refused create.
	lv := &v1.LocalVolume{}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: volumeIDFor(t, c, "full-2")}, lv); err == nil {
		t.Errorf("a LocalVolume exists for the refused create")
	}

	// GetCapacity per segment matches what a node has left.
	gc, err := c.ctrl.Controller.GetCapacity(ctx, &csi.GetCapacityRequest{AccessibleTopology: topologyOf("node-1"), VolumeCapabilities: mnt})
	if err != nil {
		t.Fatal(err)
	}
	want := int64(300 * mi)
	for _, v := range vols {
		if nodeOfVol(v) == "node-1" {
			want -= v.GetCapacityBytes()
		}
	}
	if gc.GetAvailableCapacity() != want {
		t.Errorf("GetCapacity(node-1) = %d, want %d", gc.GetAvailableCapacity(), want)
	}
}

func volumeIDFor(_ *testing.T, _ *fixture, name string) string { return lcluster.VolumeIDFor(name) }

func TestPlacementRaceNeverOversubscribes(t *testing.T) {
	c := startNodes(t, 100*mi)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, exhausted := 0, 0
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.create(ctx, fmt.Sprintf("race-%d", i), 10*mi, nil)
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				ok++
			case codes.ResourceExhausted:
				exhausted++
			default:
				t.Errorf("create race-%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if ok != 10 || exhausted != 14 {
		t.Fatalf("%d created, %d refused; want exactly 10 x 10Mi on a 100Mi node", ok, exhausted)
	}
	list := &v1.LocalVolumeList{}
	if err := c.env.Client.List(ctx, list); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, lv := range list.Items {
		total += lv.Spec.Size.Value()
	}
	if total > 100*mi {
		t.Fatalf("node oversubscribed: %d bytes placed on 100Mi", total)
	}
}

func TestDeleteWhileNodePluginStoppedCompletesOnReturn(t *testing.T) {
	c := startNodes(t, 100*mi)
	ctx := context.Background()
	v, err := c.create(ctx, "del-later", 10*mi, nil)
	if err != nil {
		t.Fatal(err)
	}
	node := c.nodes["node-0"]
	dataDir := node.Opts.DataRoot + "/volumes/" + v.GetVolumeId()
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("volume data missing: %v", err)
	}
	node.Stop(t)
	if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume with the node plugin stopped: %v", err)
	}
	// The object waits, with the delete intent, for its node plugin; the
	// data is still there.
	lv := &v1.LocalVolume{}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, lv); err != nil || !lv.Spec.DeleteData {
		t.Fatalf("LocalVolume should wait with deleteData: %v %+v", err, lv.Spec)
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("data removed while the node plugin was stopped: %v", err)
	}
	c.env.StartNodeWith(t, node.Dir, node.Opts)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.env.Client.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, lv)
		_, serr := os.Stat(dataDir)
		if client.IgnoreNotFound(err) == nil && err != nil && errors.Is(serr, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the node plugin returned: object err=%v, data err=%v", err, serr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestRestoreAndCloneFromAnotherNodeIsResourceExhausted(t *testing.T) {
	c := startNodes(t, 100*mi, 100*mi)
	ctx := context.Background()
	pin0 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}}
	pin1 := &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}, Preferred: []*csi.Topology{topologyOf("node-1")}}
	src, err := c.create(ctx, "src", 10*mi, pin0)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.ctrl.Controller.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: src.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.GetSnapshot().GetReadyToUse() {
		t.Fatal("snapshot not ready")
	}
	for _, cs := range []*csi.VolumeContentSource{
		{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}},
		{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}},
	} {
		_, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "restore-" + fmt.Sprint(cs.GetSnapshot() != nil), VolumeCapabilities: mnt,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 10 * mi}, VolumeContentSource: cs, AccessibilityRequirements: pin1,
		})
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("restore/clone onto node-1 from node-0: %v, want ResourceExhausted", err)
		}
		// Without pinning it goes to the source's node.
		v, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
			Name: "restore-ok-" + fmt.Sprint(cs.GetSnapshot() != nil), VolumeCapabilities: mnt,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * mi}, VolumeContentSource: cs,
		})
		if err != nil || nodeOfVol(v.GetVolume()) != "node-0" || v.GetVolume().GetCapacityBytes() != 20*mi {
			t.Errorf("restore/clone without topology: %v on %v", err, v.GetVolume())
		}
	}
}
