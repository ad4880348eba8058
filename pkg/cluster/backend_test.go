package cluster

import (
	"context"
	"sync/atomic"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// A DeleteVolume records the intent and deletes (two writes), and returns
// once the controller's own reads no longer find the volume; a repeated
// one, while the node plugin removes the data, writes nothing (#14: no
// write that changes nothing). Nor does any call read the API server: the
// object cache answers.
func TestDeleteVolumeWrites(t *testing.T) {
	var writes, reads atomic.Int32
	lv := placed("v", "a", mi, v1.PhaseReady)
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(node("a", 100*mi, 100*mi, 0), lv).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				reads.Add(1)
				return c.Get(ctx, k, o, opts...)
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
	ctx := context.Background()
	if err := b.DeleteVolume(ctx, lv.Name); err != nil {
		t.Fatal(err)
	}
	if n := writes.Load(); n != 2 {
		t.Fatalf("DeleteVolume: %d writes, want 2 (the intent, the delete)", n)
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
	if n := writes.Load(); n != 2 {
		t.Errorf("a repeated DeleteVolume wrote %d times more", n-2)
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("%d GETs: reads come from the cache", n)
	}
}
