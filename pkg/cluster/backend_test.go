package cluster

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// A DeleteVolume records the intent (one write; the node plugin deletes
// the object after the data), and returns
// once the controller's own reads no longer find the volume; a repeated
// one, while the node plugin removes the data, writes nothing (#14: no
// write that changes nothing). The DeleteVolume of a cached volume reads
// nothing from the API server: the object cache answers (a call for an
// id the cache no longer has reads it once: getOrRead).
func TestDeleteVolumeWrites(t *testing.T) {
	lv := placed("v", "a", mi, v1.PhaseReady)
	b, c, writes, reads := countingBackend(t, node("a", 100*mi, 100*mi, 0), lv)
	ctx := context.Background()
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Fatalf("DeleteVolume: %d writes, want 1 (the intent)", n)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("DeleteVolume: %d GETs: reads come from the cache", n)
	}
	got := &v1.LocalVolume{}
	if err := c.Get(ctx, client.ObjectKey{Name: lv.Name}, got); err != nil || !got.Spec.DeleteData || got.DeletionTimestamp != nil || len(got.Finalizers) != 0 {
		t.Fatalf("after DeleteVolume: %v, deleteData %v, %+v; want a live object with the intent and no finalizer", err, got.Spec.DeleteData, got.ObjectMeta)
	}
	// Read your writes: at once, no call finds the volume any more.
	if _, err := b.Volume(ctx, lv.Name); err == nil {
		t.Error("Volume() finds the volume right after its DeleteVolume")
	}
	if vols, _, err := b.ListVolumes(ctx, "", 0); err != nil || len(vols) != 0 {
		t.Errorf("ListVolumes right after DeleteVolume: %d volumes (%v), want none", len(vols), err)
	}
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a repeated DeleteVolume wrote %d times more", n-1)
	}
}

// Once DeleteVolume / DeleteSnapshot returned, while the node plugin has
// not yet removed the data and the object, every call treats them as gone:
// a restore from the snapshot or a clone of the volume is NOT_FOUND, an
// expansion or modify of the volume NOT_FOUND, a CreateVolume or
// CreateSnapshot of the same name is told to retry (ABORTED).
func TestPendingDeleteIsGone(t *testing.T) {
	lv := placed("v", "a", mi, v1.PhaseReady)
	ls := &v1.LocalSnapshot{ObjectMeta: metav1.ObjectMeta{Name: SnapshotIDFor("s"), Labels: map[string]string{v1.NodeLabel: "a"}},
		Spec: v1.LocalSnapshotSpec{SourceVolume: lv.Name, Node: "a", CSIName: "s"}, Status: v1.LocalSnapshotStatus{ReadyToUse: true, Phase: v1.PhaseReady}}
	b, _, _, _ := countingBackend(t, node("a", 100*mi, 100*mi, 0), lv, ls)
	b.Wait = 2 * time.Second // no node plugin here: a call that waits for one fails
	ctx := context.Background()
	if err := b.DeleteSnapshot(ctx, ls.Name); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	mount := contract.CreateSpec{SizeBytes: mi, AccessType: contract.AccessMount}
	restore, clone, again := mount, mount, mount
	restore.Name, restore.SourceSnapshotID = "restore", ls.Name
	clone.Name, clone.SourceVolumeID = "clone", lv.Name
	again.Name = "v"
	for what, spec := range map[string]contract.CreateSpec{"restore": restore, "clone": clone} {
		if _, err := b.CreateVolume(ctx, spec, nil); contract.Code(err) != codes.NotFound {
			t.Errorf("%s from a source whose delete returned: %v, want NOT_FOUND", what, err)
		}
	}
	if _, err := b.CreateVolume(ctx, again, nil); contract.Code(err) != codes.Aborted {
		t.Errorf("CreateVolume of the name of a pending delete: %v, want ABORTED", err)
	}
	if _, err := b.CreateSnapshot(ctx, "s", lv.Name, nil, 1); contract.Code(err) != codes.Aborted {
		t.Errorf("CreateSnapshot of the name of a pending delete: %v, want ABORTED", err)
	}
	if _, err := b.ExpandVolume(ctx, lv.Name, 2*mi); contract.Code(err) != codes.NotFound {
		t.Errorf("ExpandVolume of a deleted volume: %v, want NOT_FOUND", err)
	}
	if err := b.ModifyVolume(ctx, lv.Name, map[string]string{"dirMode": "0750"}); contract.Code(err) != codes.NotFound {
		t.Errorf("ModifyVolume of a deleted volume: %v, want NOT_FOUND", err)
	}
}

// The cache may lag behind objects this process did not write (a node
// plugin's re-adopted data; a watch re-established after the CRDs came
// back): an id the CO gives that the cache lacks is read from the API
// server, so a restore from it works and its DeleteVolume deletes.
func TestCacheMissReadsTheAPIServer(t *testing.T) {
	lv := placed("v", "a", mi, v1.PhaseReady)
	ls := &v1.LocalSnapshot{ObjectMeta: metav1.ObjectMeta{Name: SnapshotIDFor("s"), Labels: map[string]string{v1.NodeLabel: "a"}},
		Spec: v1.LocalSnapshotSpec{Node: "a", SourceVolume: lv.Name, CSIName: "s"}, Status: v1.LocalSnapshotStatus{ReadyToUse: true}}
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 0), lv, ls)
	eventually(t, "the cache to hold the volume and the snapshot", func() bool {
		_, okv := get[*v1.LocalVolume](b.cache.volumes, lv.Name)
		_, oks := get[*v1.LocalSnapshot](b.cache.snapshots, ls.Name)
		return okv && oks
	})
	// A lagging cache: it has neither.
	if err := b.cache.volumes.GetStore().Delete(lv); err != nil {
		t.Fatal(err)
	}
	if err := b.cache.snapshots.GetStore().Delete(ls); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if s, err := b.Snapshot(ctx, ls.Name); err != nil || s.SourceVolumeID != lv.Name {
		t.Fatalf("Snapshot() of a snapshot the cache lacks: %+v %v", s, err)
	}
	if v, err := b.Volume(ctx, lv.Name); err != nil || v.ID != lv.Name {
		t.Fatalf("Volume() of a volume the cache lacks: %+v %v", v, err)
	}
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	got := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: lv.Name}, got); err == nil && !got.Spec.DeleteData {
		t.Fatalf("DeleteVolume of a volume the cache lacked did not record the delete intent: %+v", got.Spec)
	}
	// The names CreateVolume and CreateSnapshot check stay cache-only.
	if v, err := b.VolumeByName(ctx, "v"); err != nil || v != nil {
		t.Errorf("VolumeByName read past the cache: %+v %v", v, err)
	}
}

// csi-provisioner repeats most DeleteVolume calls. Once the node plugin
// let go of a volume this controller deleted, the repeat answers without
// a request; a volume the controller did not delete is still read from
// the API server when its cache lacks it; and a CreateVolume of the same
// name makes the next DeleteVolume delete the new volume.
func TestRepeatedDeleteOfAGoneVolumeReadsNothing(t *testing.T) {
	lv := placed("v", "a", mi, v1.PhaseReady)
	b, c, writes, reads := countingBackend(t, node("a", 100*mi, 100*mi, 0), lv)
	ctx := context.Background()
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	// The node plugin removed the data and deleted the object.
	if err := c.Delete(ctx, &v1.LocalVolume{ObjectMeta: metav1.ObjectMeta{Name: lv.Name}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cache to drop the deleted volume", func() bool {
		_, ok := get[*v1.LocalVolume](b.cache.volumes, lv.Name)
		return !ok
	})
	reads.Store(0)
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("a repeated DeleteVolume of a volume deleted here and gone read %d times", n)
	}
	// Not deleted here: the cache's miss is checked with the API server.
	if err := b.DeleteVolume(ctx, VolumeIDFor("other")); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("DeleteVolume of a volume the cache lacks and this controller did not delete: %d GETs, want 1", n)
	}

	// The same name again: written, then (no node plugin here) the wait
	// for it to be Ready times out.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	before := writes.Load()
	if _, err := b.CreateVolume(short, contract.CreateSpec{Name: "v", SizeBytes: mi, AccessType: contract.AccessMount}, nil); err == nil {
		t.Fatal("CreateVolume returned a volume no node plugin made")
	}
	if writes.Load() == before {
		t.Fatal("CreateVolume wrote nothing")
	}
	// Until the cache shows the new object, only this tells a repeated
	// DeleteVolume that it is not the one deleted before.
	if _, ok := b.deleted.Get(lv.Name); ok {
		t.Error("CreateVolume of a name deleted before leaves its id among the deleted ones")
	}
	before = writes.Load()
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load() - before; n != 1 {
		t.Errorf("DeleteVolume of the re-created volume: %d writes, want 1 (the intent)", n)
	}
}

// The controller remembers the newest maxDeletedIDs deleted ids, and no
// more however often ids are added and removed.
func TestDeletedIDsBounded(t *testing.T) {
	d := fakeBackend(t, 0).deleted
	has := func(id string) bool { _, ok := d.Get(id); return ok }
	for i := range maxDeletedIDs + 5 {
		d.Add(VolumeIDFor(strconv.Itoa(i)), nil)
	}
	if has(VolumeIDFor("0")) || has(VolumeIDFor("4")) || !has(VolumeIDFor("5")) || !has(VolumeIDFor(strconv.Itoa(maxDeletedIDs+4))) {
		t.Error("the deleted ids kept are not exactly the newest ones")
	}
	for i := range 5 * maxDeletedIDs {
		id := VolumeIDFor("churn-" + strconv.Itoa(i))
		d.Add(id, nil)
		d.Remove(id)
	}
	if n := d.Len(); n > maxDeletedIDs {
		t.Errorf("the controller holds %d deleted ids, more than %d", n, maxDeletedIDs)
	}
}

// countingBackend is a controller backend on a fake client holding objs,
// with the client, its writes (create, patch, delete) and its GETs counted.
func countingBackend(t *testing.T, objs ...client.Object) (b *ControllerBackend, c client.WithWatch, writes, reads *atomic.Int32) {
	t.Helper()
	writes, reads = new(atomic.Int32), new(atomic.Int32)
	c = fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				reads.Add(1)
				return c.Get(ctx, k, o, opts...)
			},
			Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				writes.Add(1)
				return c.Create(ctx, o, opts...)
			},
			Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
				writes.Add(1)
				return c.Patch(ctx, o, p, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
				writes.Add(1)
				return c.Delete(ctx, o, opts...)
			},
		}).Build()
	b, err := newControllerBackend(t.Context(), c, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b, c, writes, reads
}
