// Package datasafety shows that users' data is destroyed only by a
// DeleteVolume or DeleteSnapshot for it: deleting the CRDs (with the node
// plugin running or gone) or deleting a LocalVolume by hand (a pending
// delete's too) keeps the data, and the node plugin re-adopts it
// (re-creates the objects) so existing volumes work again with no manual
// step. Live objects carry no finalizer, so none of this waits on a node
// plugin.
package datasafety

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

var mnt = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

type fixture struct {
	env  *clustertest.Env
	node *clustertest.Plugin
	ctrl *clustertest.Plugin
	ctx  context.Context
}

func startOneNode(t *testing.T) *fixture {
	env := clustertest.Start(t)
	f := &fixture{env: env, ctx: context.Background()}
	f.node = env.StartNode(t, "node-a", func(o *driver.Options) { o.CapacityBytes = 1 << 30 })
	env.WaitLocalNode(t, "node-a")
	f.ctrl = env.StartController(t, nil)
	return f
}

// volume creates a volume and writes a marker file into its data.
func (f *fixture) volume(t *testing.T, name string) (id, marker string) {
	t.Helper()
	resp, err := f.ctrl.Controller.CreateVolume(f.ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	id = resp.GetVolume().GetVolumeId()
	marker = filepath.Join(f.node.Opts.DataRoot, "volumes", id, "marker")
	if err := os.WriteFile(marker, []byte("data of "+name), 0o644); err != nil {
		t.Fatal(err)
	}
	return id, marker
}

func mustHave(t *testing.T, marker, want string) {
	t.Helper()
	got, err := os.ReadFile(marker)
	if err != nil || string(got) != want {
		t.Fatalf("data at %s: %q, %v; want %q", marker, got, err, want)
	}
}

// waitReadopted waits until the object named id exists again, Ready, with
// the readopted label.
func (f *fixture) waitReadopted(t *testing.T, obj client.Object, id string, ready func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		err := f.env.Client.Get(f.ctx, client.ObjectKey{Name: id}, obj)
		if err == nil && obj.GetLabels()[v1.ReadoptedLabel] == "true" && obj.GetDeletionTimestamp() == nil && ready() {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s was not re-adopted", id)
}

// waitControllerSeesNode waits (60 s at most) until the controller
// reports capacity for node (its cache holds the node's LocalNode).
func (f *fixture) waitControllerSeesNode(t *testing.T, node string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		c, err := f.ctrl.Controller.GetCapacity(f.ctx, &csi.GetCapacityRequest{
			AccessibleTopology: &csi.Topology{Segments: map[string]string{driver.TopologyKey: node}}})
		if err == nil && c.GetAvailableCapacity() > 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("the controller never saw node %s again", node)
}

// noFinalizers fails unless the object named id carries no finalizer.
func (f *fixture) noFinalizers(t *testing.T, obj client.Object, id string) {
	t.Helper()
	if err := f.env.Client.Get(f.ctx, client.ObjectKey{Name: id}, obj); err != nil {
		t.Fatal(err)
	}
	if fin := obj.GetFinalizers(); len(fin) != 0 {
		t.Fatalf("%s carries finalizers %v although nobody asked to delete it", id, fin)
	}
}

func TestCRDsDeletedAndReinstalledKeepsAndReadoptsData(t *testing.T) {
	// An uninstall deletes the DaemonSet and the CRDs together: the node
	// plugins may still run while the objects go, or be gone already.
	t.Run("node plugin running", func(t *testing.T) { crdsDeletedAndReinstalled(t, false) })
	t.Run("node plugin gone", func(t *testing.T) { crdsDeletedAndReinstalled(t, true) })
}

func crdsDeletedAndReinstalled(t *testing.T, nodeGone bool) {
	f := startOneNode(t)
	id, marker := f.volume(t, "pvc-crd")
	snap, err := f.ctrl.Controller.CreateSnapshot(f.ctx, &csi.CreateSnapshotRequest{Name: "snap-crd", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	f.noFinalizers(t, &v1.LocalVolume{}, id)
	f.noFinalizers(t, &v1.LocalSnapshot{}, sid)
	if nodeGone {
		f.node.Stop(t)
	}

	// Uninstall the CRDs, as `kubectl delete -k deploy/kubernetes` does.
	scheme := runtime.NewScheme()
	_ = apiextensionsv1.AddToScheme(scheme)
	c, err := client.New(f.env.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	crdDir := filepath.Join(clustertest.Root(t), "deploy", "kubernetes", "crds")
	for _, n := range []string{"localvolumes", "localsnapshots", "localnodes"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		crd.Name = n + ".localdir.csi.dev"
		if err := c.Delete(f.ctx, crd); err != nil {
			t.Fatalf("delete CRD %s: %v", n, err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		left := 0
		for _, n := range []string{"localvolumes", "localsnapshots", "localnodes"} {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(f.ctx, client.ObjectKey{Name: n + ".localdir.csi.dev"}, crd); !apierrors.IsNotFound(err) {
				left++
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d CRDs still there after 60s (objects held by finalizers?)", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nothing was deleted meanwhile.
	mustHave(t, marker, "data of pvc-crd")
	if _, err := os.Stat(filepath.Join(f.node.Opts.DataRoot, "snapshots", sid)); err != nil {
		t.Fatalf("snapshot data gone after the CRDs were deleted: %v", err)
	}

	// Install again: the node plugin re-creates the objects.
	if _, err := envtest.InstallCRDs(f.env.Config, envtest.CRDInstallOptions{Paths: []string{crdDir}}); err != nil {
		t.Fatal(err)
	}
	if nodeGone {
		f.node = f.env.StartNodeWith(t, f.node.Dir, f.node.Opts)
	}
	lv := &v1.LocalVolume{}
	f.waitReadopted(t, lv, id, func() bool { return lv.Status.Phase == v1.PhaseReady })
	if lv.Spec.Size.Value() != 8<<20 || lv.Spec.Node != "node-a" || lv.Spec.CSIName != "pvc-crd" {
		t.Errorf("re-adopted spec %+v", lv.Spec)
	}
	ls := &v1.LocalSnapshot{}
	f.waitReadopted(t, ls, sid, func() bool { return ls.Status.ReadyToUse })
	mustHave(t, marker, "data of pvc-crd")

	// The controller survived the CRDs' deletion: its watches come back
	// with the CRDs, after a backoff of seconds. Until its cache shows the
	// node again, placement answers RESOURCE_EXHAUSTED, which a CO retries;
	// wait for that, as the provisioner would.
	f.waitControllerSeesNode(t, "node-a")
	// The volume works again through CSI, and the snapshot restores.
	if _, err := f.ctrl.Controller.ControllerGetVolume(f.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("ControllerGetVolume after re-adoption: %v", err)
	}
	again, err := f.ctrl.Controller.CreateVolume(f.ctx, &csi.CreateVolumeRequest{
		Name: "pvc-crd", VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
	})
	if err != nil || again.GetVolume().GetVolumeId() != id {
		t.Errorf("repeated CreateVolume after re-adoption: %v %v", again, err)
	}
	restored, err := f.ctrl.Controller.CreateVolume(f.ctx, &csi.CreateVolumeRequest{
		Name: "pvc-restored", VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}},
	})
	if err != nil {
		t.Fatalf("restore from the re-adopted snapshot: %v", err)
	}
	mustHave(t, filepath.Join(f.node.Opts.DataRoot, "volumes", restored.GetVolume().GetVolumeId(), "marker"), "data of pvc-crd")

	// A real DeleteVolume still removes the data.
	if _, err := f.ctrl.Controller.DeleteVolume(f.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, filepath.Dir(marker))
}

func waitGone(t *testing.T, p string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s still exists after DeleteVolume", p)
}

func TestLocalVolumeDeletedByHandIsReadopted(t *testing.T) {
	f := startOneNode(t)
	id, marker := f.volume(t, "pvc-hand")
	lv := &v1.LocalVolume{}
	f.noFinalizers(t, lv, id)
	uid := lv.UID
	if err := f.env.Client.Delete(f.ctx, lv); err != nil {
		t.Fatal(err)
	}
	lv = &v1.LocalVolume{}
	f.waitReadopted(t, lv, id, func() bool { return lv.Status.Phase == v1.PhaseReady })
	if lv.UID == uid {
		t.Fatal("the object was never deleted")
	}
	mustHave(t, marker, "data of pvc-hand")
	if _, err := f.ctrl.Controller.ControllerGetVolume(f.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("ControllerGetVolume after re-adoption: %v", err)
	}
}

// A DeleteVolume while the node plugin is gone for good leaves the object
// alive with the delete intent (spec.deleteData), waiting for the node
// plugin, and no finalizer. Deleting it by hand, the documented command,
// deletes nothing; if the node comes back its data is re-adopted, and the
// documented removal (recording the intent) deletes it for good.
func TestStuckDeleteDeletedByHandKeepsData(t *testing.T) {
	f := startOneNode(t)
	id, marker := f.volume(t, "pvc-stuck")
	f.node.Stop(t) // the node plugin is gone: nobody carries the delete out
	if _, err := f.ctrl.Controller.DeleteVolume(f.ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	lv := &v1.LocalVolume{}
	if err := f.env.Client.Get(f.ctx, client.ObjectKey{Name: id}, lv); err != nil || lv.DeletionTimestamp != nil ||
		!lv.Spec.DeleteData || len(lv.Finalizers) != 0 {
		t.Fatalf("object should be alive with deleteData and no finalizer: %v %+v", err, lv.ObjectMeta)
	}
	// The controller no longer serves it.
	if _, err := f.ctrl.Controller.ControllerGetVolume(f.ctx, &csi.ControllerGetVolumeRequest{VolumeId: id}); err == nil {
		t.Error("ControllerGetVolume finds a volume whose DeleteVolume succeeded")
	}
	// The documented command: delete the object by hand. Nothing holds it.
	if err := f.env.Client.Delete(f.ctx, lv); err != nil {
		t.Fatal(err)
	}
	lv = f.keptAndReadopted(t, id, marker, "pvc-stuck", "kubectl delete")

	// Removing an orphan for good, the documented way: record the delete
	// intent; the node plugin removes the data, then the object.
	p := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"deleteData":true}}`))
	if err := f.env.Client.Patch(f.ctx, lv, p); err != nil {
		t.Fatal(err)
	}
	waitGone(t, filepath.Dir(marker))
	deadline := time.Now().Add(30 * time.Second)
	for f.env.Client.Get(f.ctx, client.ObjectKey{Name: id}, lv) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("object still there after its data was removed: %+v", lv.ObjectMeta)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// keptAndReadopted checks that LocalVolume id (of the PVC name, whose
// marker file volume wrote) is gone after what and its data kept, then
// starts the stopped node plugin again and waits until it re-adopts the
// data, which is still there. It returns the re-adopted object.
func (f *fixture) keptAndReadopted(t *testing.T, id, marker, name, what string) *v1.LocalVolume {
	t.Helper()
	lv := &v1.LocalVolume{}
	if err := f.env.Client.Get(f.ctx, client.ObjectKey{Name: id}, lv); !apierrors.IsNotFound(err) {
		t.Fatalf("object still there after %s: %v", what, err)
	}
	mustHave(t, marker, "data of "+name)
	f.node = f.env.StartNodeWith(t, f.node.Dir, f.node.Opts)
	lv = &v1.LocalVolume{}
	f.waitReadopted(t, lv, id, func() bool { return lv.Status.Phase == v1.PhaseReady })
	mustHave(t, marker, "data of "+name)
	return lv
}
