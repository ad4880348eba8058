package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// nodeFixture is one node's data root (dir engine, no root needed) and a
// fake API server holding objs.
func nodeFixture(t *testing.T, objs ...client.Object) (client.Client, *volume.Store) {
	t.Helper()
	vm, err := volume.Open(volume.Config{DataRoot: filepath.Join(t.TempDir(), "data"), CapacityBytes: 1 << 30, Engine: "dir"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	pub, err := publish.New(vm.NodeAccess(), publish.Config{Mounter: mount.NewFake()})
	if err != nil {
		t.Fatal(err)
	}
	if err := vm.Recover(pub); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1.LocalVolume{}, &v1.LocalSnapshot{}, &v1.LocalNode{}).Build()
	return c, vm
}

func reconcileOnce(t *testing.T, r reconcile.Reconciler, name string) reconcile.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		t.Fatalf("reconcile %s: %v", name, err)
	}
	return res
}

func TestLocalVolumeReconcilerCreatesGrowsDeletes(t *testing.T) {
	ctx := context.Background()
	lv := placed("pvc-1", "n", 8*mi, "")
	other := placed("pvc-other", "elsewhere", 8*mi, "")
	c, vm := nodeFixture(t, lv, other)
	r := &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}

	reconcileOnce(t, r, lv.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); err != nil {
		t.Fatal(err)
	}
	if lv.Status.Phase != v1.PhaseReady || lv.Status.CapacityBytes.String() != "8Mi" || lv.Status.ErrorCode != "" || lv.Status.Path == "" {
		t.Fatalf("after the first reconcile: %+v, want Ready with 8Mi", lv.Status)
	}
	if v, err := vm.Get(lv.Name); err != nil || v.CapacityBytes != 8*mi || v.Name != "pvc-1" {
		t.Fatalf("local volume %+v, %v; want 8Mi of pvc-1", v, err)
	}

	lv.Spec.Size = quantity(16 * mi)
	if err := c.Update(ctx, lv); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, lv.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); err != nil || lv.Status.CapacityBytes.Value() != 16*mi {
		t.Fatalf("after growing spec.size to 16Mi: status capacity %s (%v)", &lv.Status.CapacityBytes, err)
	}

	// Another node's object is not this node's business.
	reconcileOnce(t, r, other.Name)
	if _, err := vm.Get(other.Name); !errors.Is(err, contract.ErrNotFound) {
		t.Errorf("another node's volume was created here: %v", err)
	}

	// DeleteVolume records the intent alone: one reconcile removes the
	// data, then deletes the object (no finalizer to remove).
	lv.Spec.DeleteData = true
	lv.Generation++ // what the API server does for a spec change
	if err := c.Update(ctx, lv); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, lv.Name)
	if _, err := vm.Get(lv.Name); !errors.Is(err, contract.ErrNotFound) {
		t.Errorf("data after a delete with intent: %v, want it gone", err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); !apierrors.IsNotFound(err) {
		t.Errorf("LocalVolume after its data was deleted: %v (finalizers %v, phase %q), want it deleted", err, lv.Finalizers, lv.Status.Phase)
	}
	// Its NotFound reconcile finds no data to re-adopt.
	reconcileOnce(t, r, lv.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); !apierrors.IsNotFound(err) {
		t.Errorf("a deleted volume came back: %v", err)
	}
}

func TestLocalVolumeReconcilerReportsFailure(t *testing.T) {
	lv := placed("pvc-bad", "n", 8*mi, "")
	lv.Spec.Parameters = map[string]string{"dirMode": "not-octal"}
	c, vm := nodeFixture(t, lv)
	reconcileOnce(t, &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}, lv.Name)
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(lv), lv); err != nil {
		t.Fatal(err)
	}
	if lv.Status.Phase != v1.PhaseFailed || lv.Status.ErrorCode != "InvalidArgument" {
		t.Errorf("a LocalVolume with a bad parameter: phase %q, errorCode %q; want Failed, InvalidArgument", lv.Status.Phase, lv.Status.ErrorCode)
	}
}

func TestLocalSnapshotReconcilerAndHeartbeat(t *testing.T) {
	ctx := context.Background()
	src := placed("pvc-src", "n", 4*mi, "")
	ls := &v1.LocalSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: SnapshotIDFor("snap-1"), Labels: map[string]string{v1.NodeLabel: "n"}},
		Spec:       v1.LocalSnapshotSpec{SourceVolume: src.Name, Node: "n", CSIName: "snap-1"},
	}
	c, vm := nodeFixture(t, src, ls)
	reconcileOnce(t, &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}, src.Name)
	reconcileOnce(t, &LocalSnapshotReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}, ls.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(ls), ls); err != nil {
		t.Fatal(err)
	}
	if !ls.Status.ReadyToUse || ls.Status.SizeBytes.String() != "4Mi" || ls.Status.CreationTime == nil {
		t.Errorf("snapshot status %+v, want ready, 4Mi, with a creation time", ls.Status)
	}
	// DeleteSnapshot's intent: the data goes, then the object.
	local, err := vm.Snapshots().Get(ls.Name)
	if err != nil {
		t.Fatal(err)
	}
	snapPath := vm.Snapshots().Path(local)
	ls.Spec.DeleteData = true
	if err := c.Update(ctx, ls); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, &LocalSnapshotReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}, ls.Name)
	if _, err := os.Stat(snapPath); !os.IsNotExist(err) {
		t.Errorf("snapshot data at %s after the delete intent: %v, want it gone", snapPath, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ls), ls); !apierrors.IsNotFound(err) {
		t.Errorf("LocalSnapshot after its data was deleted: %v, want it deleted", err)
	}

	// Data no object claims: the heartbeat re-adopts it.
	if _, err := vm.Create(contract.CreateSpec{ID: VolumeIDFor("pvc-lost"), Name: "pvc-lost", SizeBytes: 2 * mi, AccessType: contract.AccessMount}); err != nil {
		t.Fatal(err)
	}
	h := &LocalNodeHeartbeat{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots(), Version: "test", MaxVolumeBytes: 512 * mi}
	if err := h.write(ctx); err != nil {
		t.Fatal(err)
	}
	ln := &v1.LocalNode{}
	if err := c.Get(ctx, client.ObjectKey{Name: "n"}, ln); err != nil {
		t.Fatal(err)
	}
	if ln.Status.CapacityBytes.String() != "1Gi" || ln.Status.MaxVolumeBytes.String() != "512Mi" || ln.Status.DriverVersion != "test" || len(ln.Status.Orphans) != 0 {
		t.Errorf("LocalNode status %+v, want 1Gi capacity, 512Mi max, no orphans left", ln.Status)
	}
	lost := &v1.LocalVolume{}
	if err := c.Get(ctx, client.ObjectKey{Name: VolumeIDFor("pvc-lost")}, lost); err != nil || lost.Labels[v1.ReadoptedLabel] != "true" || lost.Spec.Size.Value() != 2*mi {
		t.Errorf("re-adopted LocalVolume %+v (%v), want one of 2Mi labelled readopted", lost.ObjectMeta, err)
	}
}

// TestLocalVolumeReconcilerMakesImageVolumes: a LocalVolume with fsType is
// created on the node as an image volume of that filesystem, and the
// backend reads the fsType back.
func TestLocalVolumeReconcilerMakesImageVolumes(t *testing.T) {
	lv := placed("pvc-img", "n", 8*mi, "")
	lv.Spec.FsType = "ext4"
	c, vm := nodeFixture(t, lv)
	r := &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}
	reconcileOnce(t, r, lv.Name)
	v, err := vm.Get(lv.Name)
	if err != nil || v.FsType != "ext4" || !v.Image() {
		t.Fatalf("local volume %+v, %v; want an ext4 image volume", v, err)
	}
	if got := toVolume(lv); got.FsType != "ext4" {
		t.Fatalf("toVolume dropped the fsType: %+v", got)
	}
}

// The node applies spec.mutableParameters and reports them in status:
// at create, after a change of the spec, and a parameter its data root
// cannot take (compression, not on btrfs) as status.modifyErrorCode with
// the Modified condition saying why, the volume staying Ready. The
// controller's ModifyVolume waits for that status, returns the node's
// error and takes the refused parameter back from the spec.
func TestMutableParameters(t *testing.T) {
	ctx := context.Background()
	lv := placed("pvc-m", "n", 8*mi, "")
	lv.Spec.MutableParameters = map[string]string{"dirMode": "0700"}
	c, vm := nodeFixture(t, lv, node("n", 100*mi, 100*mi, 0))
	r := &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}
	get := func() *v1.LocalVolume {
		t.Helper()
		got := &v1.LocalVolume{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(lv), got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	reconcileOnce(t, r, lv.Name)
	got := get()
	if got.Status.Phase != v1.PhaseReady || got.Status.MutableParameters["dirMode"] != "0700" || got.Status.ModifyErrorCode != "" {
		t.Fatalf("after the create: %+v, want Ready with dirMode 0700 in effect", got.Status)
	}
	if fi, err := os.Stat(got.Status.Path); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("mode of the volume's root: %v (%v), want 0700", fi.Mode().Perm(), err)
	}

	b, err := newControllerBackend(t.Context(), c.(client.WithWatch), 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Wait = 10 * time.Second
	// The node plugin: reconcile all the time (the fake API server keeps no
	// generations, so none can tell a spec change).
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: lv.Name}})
		}
	}()
	if err := b.ModifyVolume(ctx, lv.Name, map[string]string{"dirMode": "0750"}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(got.Status.Path); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("after ModifyVolume dirMode=0750: mode %v (%v)", fi.Mode().Perm(), err)
	}
	err = b.ModifyVolume(ctx, lv.Name, map[string]string{"compression": "zstd"})
	if contract.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "btrfs") {
		t.Errorf("ModifyVolume compression=zstd on a dir engine data root: %v, want INVALID_ARGUMENT saying it needs btrfs", err)
	}
	eventually(t, "the refused compression taken back from the spec, and the status clear of the error", func() bool {
		got = get()
		_, has := got.Spec.MutableParameters["compression"]
		return !has && got.Status.ObservedGeneration == got.Generation && got.Status.ModifyErrorCode == ""
	})
	if got.Status.Phase != v1.PhaseReady || got.Status.MutableParameters["dirMode"] != "0750" {
		t.Errorf("after the refused modify: %+v, want Ready, dirMode 0750 in effect", got.Status)
	}
}

// A node plugin killed between the engine's record of a growth and the
// growth of the image file: on restart the record has the new size, the
// file the old one and the object still reports the old one. The next
// reconcile finishes the growth instead of reporting the record's size
// over a smaller file.
func TestLocalVolumeReconcilerFinishesCutShortGrowth(t *testing.T) {
	ctx := context.Background()
	lv := placed("pvc-img-grow", "n", 8*mi, "")
	lv.Spec.FsType = "ext4"
	c, vm := nodeFixture(t, lv)
	r := &LocalVolumeReconciler{Client: c, NodeID: "n", Store: vm, Snapshots: vm.Snapshots()}
	reconcileOnce(t, r, lv.Name)
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); err != nil || lv.Status.CapacityBytes.Value() != 8*mi {
		t.Fatalf("after create: status capacity %s (%v), want 8Mi", &lv.Status.CapacityBytes, err)
	}
	// The cut-short growth: the record at 16Mi, the file left at 8Mi.
	if _, err := vm.Expand(lv.Name, 16*mi); err != nil {
		t.Fatal(err)
	}
	v, err := vm.Get(lv.Name)
	if err != nil {
		t.Fatal(err)
	}
	img := vm.DataPath(v)
	if err := os.Truncate(img, 8*mi); err != nil {
		t.Fatal(err)
	}
	lv.Spec.Size = quantity(16 * mi)
	if err := c.Update(ctx, lv); err != nil {
		t.Fatal(err)
	}
	reconcileOnce(t, r, lv.Name)
	if fi, err := os.Stat(img); err != nil || fi.Size() != 16*mi {
		t.Errorf("image after the reconcile: %v (%v), want 16Mi", fi, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(lv), lv); err != nil || lv.Status.CapacityBytes.Value() != 16*mi {
		t.Errorf("status capacity %s (%v), want 16Mi", &lv.Status.CapacityBytes, err)
	}
}
