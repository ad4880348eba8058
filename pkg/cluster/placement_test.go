package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

const mi = int64(1) << 20

// node is a LocalNode with a fresh heartbeat.
func node(name string, capacity, free, maxVolume int64) *v1.LocalNode {
	return &v1.LocalNode{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: v1.LocalNodeStatus{
			CapacityBytes: quantity(capacity), FreeBytes: quantity(free), MaxVolumeBytes: quantity(maxVolume),
			Heartbeat: metav1.Now(),
		},
	}
}

// placed is a LocalVolume of size bytes on node n, in phase.
func placed(name, n string, size int64, phase string) *v1.LocalVolume {
	return &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: VolumeIDFor(name), Labels: map[string]string{v1.NodeLabel: n}},
		Spec:       v1.LocalVolumeSpec{Node: n, Size: quantity(size), CSIName: name},
		Status:     v1.LocalVolumeStatus{Phase: phase},
	}
}

func newVolume(name string, size int64) *v1.LocalVolume {
	return &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: VolumeIDFor(name)},
		Spec:       v1.LocalVolumeSpec{Size: quantity(size), CSIName: name, VolumeMode: v1.VolumeModeFilesystem},
	}
}

// fakeBackend is a ControllerBackend on controller-runtime's fake client
// holding objs: placement without an API server.
func fakeBackend(t *testing.T, maxVolume int64, objs ...client.Object) *ControllerBackend {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(objs...).Build()
	b, err := newControllerBackend(t.Context(), c, maxVolume)
	if err != nil {
		t.Fatal(err)
	}
	b.Wait = 10 * time.Second
	return b
}

// create creates obj through b's client and waits until b's cache shows it
// (as a node plugin's or a user's write would arrive).
func create(t *testing.T, b *ControllerBackend, obj client.Object) {
	t.Helper()
	if err := b.c.Create(context.Background(), obj); err != nil {
		t.Fatal(err)
	}
	cached(t, b, obj.GetName(), func(*v1.LocalVolume) bool { return true })
}

// cached waits until b's cache holds LocalVolume name in a state cond
// accepts.
func cached(t *testing.T, b *ControllerBackend, name string, cond func(*v1.LocalVolume) bool) {
	t.Helper()
	eventually(t, "LocalVolume "+name+" in the controller's cache in the state awaited", func() bool {
		lv, ok := get[*v1.LocalVolume](b.cache.volumes, name)
		return ok && cond(lv) && counts(b, lv)
	})
}

// counts tells whether b's placement counts lv as the cache holds it
// (its event handler runs after the cache's store changed), or, for nil,
// counts no volume of that name.
func counts(b *ControllerBackend, lv *v1.LocalVolume) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	c, ok := b.counted[lv.Name]
	if lv.ResourceVersion == "" {
		return !ok
	}
	return ok && c.node == lv.Spec.Node && c.spec == lv.Spec.Size.Value() &&
		c.size == max(lv.Spec.Size.Value(), lv.Status.CapacityBytes.Value()) && c.failed == (lv.Status.Phase == v1.PhaseFailed)
}

// uncached waits until b's cache and placement no longer hold LocalVolume
// name.
func uncached(t *testing.T, b *ControllerBackend, name string) {
	t.Helper()
	eventually(t, "LocalVolume "+name+" gone from the controller's cache", func() bool {
		_, ok := get[*v1.LocalVolume](b.cache.volumes, name)
		return !ok && counts(b, &v1.LocalVolume{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// eventually waits (5 s at most) until cond holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 1000 {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func topo(nodes ...string) []*csi.Topology {
	var out []*csi.Topology
	for _, n := range nodes {
		out = append(out, &csi.Topology{Segments: map[string]string{contract.TopologyKey: n}})
	}
	return out
}

func TestRoom(t *testing.T) {
	stale := node("stale", 100*mi, 100*mi, 0)
	stale.Status.Heartbeat = metav1.NewTime(time.Now().Add(-StaleAfter - time.Minute))
	// At its heartbeat the node held "made" (30Mi, 5Mi of it written: 70Mi
	// free, 25Mi it may still write); "new" was placed since.
	recent := node("recent", 100*mi, 100*mi, 0)
	recent.Status.Heartbeat = metav1.NewTime(time.Now().Add(-20 * time.Second))
	counted := node("counted", 100*mi, 70*mi, 0)
	counted.Status.AllocatedBytes, counted.Status.HeadroomBytes = quantity(30*mi), quantity(25*mi)
	b := fakeBackend(t, 0,
		node("a", 100*mi, 100*mi, 0),
		placed("v1", "a", 30*mi, v1.PhaseReady),
		placed("v2", "a", 10*mi, v1.PhasePending),
		placed("failed", "a", 50*mi, v1.PhaseFailed), // holds nothing
		node("tight", 100*mi, 20*mi, 40*mi),
		counted,
		placed("made", "counted", 30*mi, v1.PhaseReady),
		placed("new", "counted", 10*mi, v1.PhasePending),
		stale, recent,
	)
	grown := placed("grown", "a", 10*mi, v1.PhaseReady)
	grown.Status.CapacityBytes = quantity(15 * mi) // the larger of spec and status counts
	create(t, b, grown)
	for _, c := range []struct {
		node              string
		available, maxVol int64
		reason            string
	}{
		{"a", 100*mi - 30*mi - 10*mi - 15*mi, 0, ""},
		{"tight", 20 * mi, 40 * mi, ""}, // free space is the limit
		// Free space less what "made" may still write, less "new": 35Mi,
		// not the 60Mi that capacity − sizes would allow (#12 item 6).
		{"counted", 70*mi - 25*mi - 10*mi, 0, ""},
		{"stale", 0, 0, "last heartbeat"},
		{"gone", 0, 0, "no LocalNode"},
	} {
		r, err := b.room(context.Background(), c.node)
		if err != nil {
			t.Fatal(err)
		}
		if r.available != c.available || r.maxVolume != c.maxVol || (c.reason == "") != (r.reason == "") || !strings.Contains(r.reason, c.reason) {
			t.Errorf("room(%s) = %+v, want available %d, max %d, reason %q", c.node, r, c.available, c.maxVol, c.reason)
		}
	}
	// --node-stale-after: a heartbeat 20 s old is fresh by default, stale
	// after 10 s.
	if r, _ := b.room(context.Background(), "recent"); r.reason != "" || r.available != 100*mi {
		t.Errorf("room(recent) with the default staleness: %+v, want 100Mi available", r)
	}
	b.StaleAfter = 10 * time.Second
	if r, _ := b.room(context.Background(), "recent"); !strings.Contains(r.reason, "last heartbeat") || r.available != 0 {
		t.Errorf("room(recent) with StaleAfter 10s: %+v, want refused for its last heartbeat", r)
	}
	b.StaleAfter = StaleAfter
	// The controller's own cap applies when smaller than the node's.
	b.MaxVolumeBytes = 30 * mi
	if r, _ := b.room(context.Background(), "tight"); r.maxVolume != 30*mi {
		t.Errorf("room(tight) with a 30Mi controller cap: max %d, want %d", r.maxVolume, 30*mi)
	}
	if r, _ := b.room(context.Background(), "a"); r.maxVolume != 30*mi {
		t.Errorf("room(a) with a 30Mi controller cap: max %d, want %d", r.maxVolume, 30*mi)
	}
}

func TestCandidates(t *testing.T) {
	b := fakeBackend(t, 0,
		node("a", 50*mi, 50*mi, 0), node("b", 80*mi, 80*mi, 0), node("c", 10*mi, 10*mi, 0), node("d", 80*mi, 80*mi, 0))
	for _, c := range []struct {
		name string
		req  *csi.TopologyRequirement
		want []string
	}{
		{"no requirements: every node, most room first, then by name", nil, []string{"b", "d", "a", "c"}},
		{"preferred first in their order, then the other requisite ones by room",
			&csi.TopologyRequirement{Requisite: topo("a", "b", "c"), Preferred: topo("c", "a")}, []string{"c", "a", "b"}},
		{"a preferred node outside the requisite ones is dropped",
			&csi.TopologyRequirement{Requisite: topo("a", "c"), Preferred: topo("d", "c")}, []string{"c", "a"}},
		{"preferred only: just those", &csi.TopologyRequirement{Preferred: topo("c", "c", "a")}, []string{"c", "a"}},
		{"a segment with another key is no node",
			&csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"zone": "x"}}}, Preferred: topo("a")}, []string{"a"}},
	} {
		got, err := b.candidates(context.Background(), c.req)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: candidates = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
}

func TestPlaceVolume(t *testing.T) {
	ctx := context.Background()
	b := fakeBackend(t, 0, node("a", 50*mi, 50*mi, 0), node("b", 100*mi, 100*mi, 20*mi), placed("src", "a", 10*mi, v1.PhaseReady))

	// Most room first, but b caps volumes at 20Mi: a 30Mi volume goes to a.
	lv := newVolume("big", 30*mi)
	if err := b.placeVolume(ctx, lv, nil, nil); err != nil {
		t.Fatal(err)
	}
	got := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: lv.Name}, got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.Node != "a" || got.Labels[v1.NodeLabel] != "a" || got.Spec.Size.String() != "30Mi" {
		t.Errorf("placed on %q (label %q) with size %s, want a, a, 30Mi", got.Spec.Node, got.Labels[v1.NodeLabel], &got.Spec.Size)
	}

	// Too big for every node: RESOURCE_EXHAUSTED naming each node's reason.
	err := b.placeVolume(ctx, newVolume("huge", 60*mi), nil, nil)
	if !errors.Is(err, contract.ErrNoSpace) || !strings.Contains(err.Error(), "b: volumes are limited to") || !strings.Contains(err.Error(), "a: 10485760 bytes available") {
		t.Errorf("placing 60Mi: %v, want ErrNoSpace naming both nodes", err)
	}

	// A clone goes to its source's node unless the requirements name
	// another first; elsewhere only as a transfer both nodes serve.
	clone := newVolume("clone", 5*mi)
	clone.Spec.ContentSource = &v1.ContentSource{Volume: "vol-src"}
	if err := b.placeVolume(ctx, clone, []string{"a"}, &csi.TopologyRequirement{Requisite: topo("a", "b")}); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Get(ctx, client.ObjectKey{Name: clone.Name}, got); err != nil || got.Spec.Node != "a" || got.Spec.ContentSource.Node != "" {
		t.Errorf("clone placed on %q from %+v (%v), want its source's node a, no transfer", got.Spec.Node, got.Spec.ContentSource, err)
	}
	clone2 := newVolume("clone2", 5*mi)
	clone2.Spec.ContentSource = &v1.ContentSource{Volume: "vol-src"}
	err = b.placeVolume(ctx, clone2, []string{"a"}, &csi.TopologyRequirement{Requisite: topo("b"), Preferred: topo("b")})
	if !errors.Is(err, contract.ErrNoSpace) || !strings.Contains(err.Error(), "serves no transfer channel") {
		t.Errorf("clone onto a node without a channel: %v, want ErrNoSpace (the provisioner reschedules)", err)
	}
	withChannel := func(n *v1.LocalNode) *v1.LocalNode {
		n.Status.Transfer = &v1.TransferEndpoint{Address: n.Name + ":9811", Certificate: "pem"}
		return n
	}
	bt := fakeBackend(t, 0, withChannel(node("a", 50*mi, 50*mi, 0)), withChannel(node("b", 100*mi, 100*mi, 0)))
	if err := bt.placeVolume(ctx, clone2, []string{"a"}, &csi.TopologyRequirement{Requisite: topo("a", "b"), Preferred: topo("b", "a")}); err != nil {
		t.Fatal(err)
	}
	if err := bt.c.Get(ctx, client.ObjectKey{Name: clone2.Name}, got); err != nil || got.Spec.Node != "b" || got.Spec.ContentSource.Node != "a" {
		t.Errorf("clone for a pod on b placed on %q from %+v (%v), want b with a transfer from a", got.Spec.Node, got.Spec.ContentSource, err)
	}

	if err := fakeBackend(t, 0).placeVolume(ctx, newVolume("v", mi), nil, nil); !errors.Is(err, contract.ErrNoSpace) {
		t.Errorf("no LocalNode at all: %v, want ErrNoSpace", err)
	}
}

// Concurrent placements on one node are serialized: never more than its
// capacity.
func TestPlaceNeverOversubscribes(t *testing.T) {
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 0))
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.placeVolume(context.Background(), newVolume(fmt.Sprintf("v%d", i), 10*mi), nil, nil)
		}()
	}
	wg.Wait()
	close(errs)
	ok, full := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case errors.Is(err, contract.ErrNoSpace):
			full++
		default:
			t.Fatal(err)
		}
	}
	if ok != 10 || full != 14 {
		t.Errorf("%d placed, %d refused; want exactly 10 x 10Mi on a 100Mi node", ok, full)
	}
}

// A placement whose API write fails gives its reservation back at once;
// one whose object an earlier attempt wrote counts that object only.
func TestPlaceWriteFailsReleases(t *testing.T) {
	ctx := context.Background()
	fail := errors.New("etcdserver: request timed out")
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(node("a", 100*mi, 100*mi, 0)).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if strings.HasPrefix(obj.(*v1.LocalVolume).Spec.CSIName, "fails") {
				return fail
			}
			return c.Create(ctx, obj, opts...)
		}}).Build()
	b, err := newControllerBackend(t.Context(), c, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.placeVolume(ctx, newVolume("fails", 60*mi), nil, nil); !errors.Is(err, fail) {
		t.Fatalf("placing with a failing write: %v, want the write's error", err)
	}
	if r, err := b.room(ctx, "a"); err != nil || r.available != 100*mi {
		t.Errorf("room after the failed write: %d bytes (%v), want all 100Mi", r.available, err)
	}
	lv := newVolume("twice", 30*mi)
	if err := b.placeVolume(ctx, lv.DeepCopy(), nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.placeVolume(ctx, lv.DeepCopy(), nil, nil); err != nil {
		t.Fatalf("placing again what an earlier attempt wrote: %v", err)
	}
	if r, err := b.room(ctx, "a"); err != nil || r.available != 70*mi {
		t.Errorf("room with one 30Mi volume placed twice: %d bytes (%v), want 70Mi", r.available, err)
	}
}

func TestGrow(t *testing.T) {
	ctx := context.Background()
	lv := placed("v", "a", 40*mi, v1.PhaseReady)
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 0), lv, placed("w", "a", 40*mi, v1.PhaseReady))
	if err := b.grow(ctx, lv.DeepCopy(), 70*mi); !errors.Is(err, contract.ErrNoSpace) {
		t.Errorf("growing 40Mi → 70Mi with 20Mi left: %v, want ErrNoSpace", err)
	}
	if err := b.grow(ctx, lv.DeepCopy(), 60*mi); err != nil {
		t.Fatal(err)
	}
	got := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: lv.Name}, got); err != nil || got.Spec.Size.Value() != 60*mi {
		t.Errorf("after growing to 60Mi: spec.size %s (%v)", &got.Spec.Size, err)
	}
}

func TestCapacity(t *testing.T) {
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 30*mi), node("b", 50*mi, 50*mi, 0), placed("v", "b", 20*mi, v1.PhaseReady))
	for _, c := range []struct {
		segment        *csi.Topology
		total, largest int64
	}{
		{nil, 100*mi + 30*mi, 30 * mi},
		{topo("a")[0], 100 * mi, 30 * mi},
		{topo("b")[0], 30 * mi, 30 * mi},
		{topo("gone")[0], 0, 0},
		{&csi.Topology{Segments: map[string]string{"zone": "x"}}, 0, 0},
	} {
		total, largest, err := b.Capacity(context.Background(), c.segment)
		if err != nil || total != c.total || largest != c.largest {
			t.Errorf("Capacity(%v) = %d, %d, %v; want %d, %d", c.segment.GetSegments(), total, largest, err, c.total, c.largest)
		}
	}
}

// A volume placed and deleted again gives its room back as soon as the
// cache shows it gone, even when no placement looked at the node in
// between (the size the controller wrote is not counted on).
func TestPlacedThenDeletedGivesRoomBack(t *testing.T) {
	ctx := context.Background()
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 0))
	lv := newVolume("v", 30*mi)
	if err := b.placeVolume(ctx, lv, nil, nil); err != nil {
		t.Fatal(err)
	}
	placedLV := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: lv.Name}, placedLV); err != nil {
		t.Fatal(err)
	}
	cached(t, b, lv.Name, func(*v1.LocalVolume) bool { return true })
	if err := b.c.Delete(ctx, placedLV); err != nil {
		t.Fatal(err)
	}
	uncached(t, b, lv.Name)
	if r, err := b.room(ctx, "a"); err != nil || r.available != 100*mi {
		t.Errorf("room after the volume went: %d bytes (%v), want all 100Mi back", r.available, err)
	}
}

// A node's used bytes follow its volumes' changes as the cache's events
// bring them (the running sum that keeps CreateVolume O(1) in the number
// of volumes): a volume that fails gives its room back, one the node grew
// takes its new size, one moved to another node counts there, a deleted
// one counts nowhere.
func TestRoomFollowsVolumeChanges(t *testing.T) {
	ctx := context.Background()
	b := fakeBackend(t, 0, node("a", 100*mi, 100*mi, 0), node("b", 100*mi, 100*mi, 0),
		placed("v1", "a", 10*mi, v1.PhaseReady), placed("v2", "a", 20*mi, v1.PhasePending))
	avail := func(node string, want int64, when string) {
		t.Helper()
		if r, err := b.room(ctx, node); err != nil || r.available != want {
			t.Errorf("%s: room(%s) = %d bytes (%v), want %d", when, node, r.available, err, want)
		}
	}
	avail("a", 70*mi, "at start")
	update := func(name string, change func(*v1.LocalVolume)) {
		t.Helper()
		lv := &v1.LocalVolume{}
		if err := b.c.Get(ctx, client.ObjectKey{Name: VolumeIDFor(name)}, lv); err != nil {
			t.Fatal(err)
		}
		change(lv)
		if err := b.c.Update(ctx, lv); err != nil {
			t.Fatal(err)
		}
		cached(t, b, lv.Name, func(c *v1.LocalVolume) bool { return c.ResourceVersion == lv.ResourceVersion })
	}
	update("v2", func(lv *v1.LocalVolume) { lv.Status.Phase = v1.PhaseFailed })
	avail("a", 90*mi, "v2 Failed")
	update("v1", func(lv *v1.LocalVolume) { lv.Status.CapacityBytes = quantity(25 * mi) })
	avail("a", 75*mi, "v1 grown to 25Mi by its node")
	update("v1", func(lv *v1.LocalVolume) { lv.Spec.Node = "b" })
	avail("a", 100*mi, "v1 moved to b")
	avail("b", 75*mi, "v1 moved to b")
	lv := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: VolumeIDFor("v1")}, lv); err != nil {
		t.Fatal(err)
	}
	if err := b.c.Delete(ctx, lv); err != nil {
		t.Fatal(err)
	}
	uncached(t, b, lv.Name)
	avail("b", 100*mi, "v1 deleted")
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.counted) != 1 || b.used["a"] != 0 || b.used["b"] != 0 {
		t.Errorf("after the changes: counted %v, used %v; want v2 alone (Failed), nothing used", b.counted, b.used)
	}
}
