package cluster

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// objectCache is the controller's view of the localdir objects: one shared
// informer per kind (one LIST and WATCH each for the process's life). Every
// read of the Controller service is answered from it (getOrRead for ids it
// lacks), and waits for node plugins are woken by its events: a provisioned
// volume costs the API server its create and the node's status write only.
type objectCache struct {
	nodes, volumes, snapshots, groups cache.SharedIndexInformer

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // by kind/name: waiters to wake
}

// cacheSyncTimeout bounds the first LIST of each kind at start: a missing
// permission fails the start instead of hanging it.
const cacheSyncTimeout = time.Minute

func newObjectCache(c client.WithWatch) *objectCache {
	oc := &objectCache{subs: map[string]map[chan struct{}]struct{}{}}
	oc.nodes = informer(c, &v1.LocalNode{}, func() client.ObjectList { return &v1.LocalNodeList{} }, nil)
	oc.volumes = informer(c, &v1.LocalVolume{}, func() client.ObjectList { return &v1.LocalVolumeList{} }, nil)
	oc.snapshots = informer(c, &v1.LocalSnapshot{}, func() client.ObjectList { return &v1.LocalSnapshotList{} }, nil)
	oc.groups = informer(c, &v1.LocalGroupSnapshot{}, func() client.ObjectList { return &v1.LocalGroupSnapshotList{} }, nil)
	return oc
}

// informer lists and watches every object of one kind through c.
func informer(c client.WithWatch, obj client.Object, newList func() client.ObjectList, idx cache.Indexers) cache.SharedIndexInformer {
	lw := listThenWatch{&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l := newList()
			return l, c.List(ctx, l, &client.ListOptions{Raw: &o})
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, newList(), &client.ListOptions{Raw: &o})
		},
	}}
	return cache.NewSharedIndexInformer(lw, obj, 0, idx)
}

// listThenWatch makes the reflector list, then watch, instead of a WatchList
// stream, which a client that does not pass it on (controller-runtime's
// fake) never ends.
type listThenWatch struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported is what client-go's reflector asks.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

// start runs the informers until ctx is done and waits (cacheSyncTimeout at
// most) until their first LIST and handlers have synced.
func (oc *objectCache) start(ctx context.Context, handlers ...cache.InformerSynced) error {
	for kind, inf := range oc.kinds() {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { oc.changed(kind, o) },
			UpdateFunc: func(_, o any) { oc.changed(kind, o) },
			DeleteFunc: func(o any) { oc.changed(kind, o) },
		}); err != nil {
			return err
		}
		go inf.RunWithContext(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, cacheSyncTimeout)
	defer cancel()
	for kind, inf := range oc.kinds() {
		if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
			return fmt.Errorf("cannot list and watch %s objects within %s (is the CRD installed, and may the controller's ServiceAccount list and watch them?)", kind, cacheSyncTimeout)
		}
	}
	if !cache.WaitForCacheSync(sctx.Done(), handlers...) {
		return fmt.Errorf("the controller's event handlers did not see the listed objects within %s", cacheSyncTimeout)
	}
	return nil
}

func (oc *objectCache) kinds() map[string]cache.SharedIndexInformer {
	return map[string]cache.SharedIndexInformer{"LocalNode": oc.nodes, "LocalVolume": oc.volumes, "LocalSnapshot": oc.snapshots, "LocalGroupSnapshot": oc.groups}
}

// changed wakes the waiters of the object o of kind.
func (oc *objectCache) changed(kind string, o any) {
	name, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o)
	if err != nil {
		return
	}
	oc.mu.Lock()
	defer oc.mu.Unlock()
	for ch := range oc.subs[kind+"/"+name] {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// subscribe returns a channel that receives after each change of the
// object kind/name seen by the cache, and the function that ends it.
func (oc *objectCache) subscribe(kind, name string) (<-chan struct{}, func()) {
	key := kind + "/" + name
	ch := make(chan struct{}, 1)
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.subs[key] == nil {
		oc.subs[key] = map[chan struct{}]struct{}{}
	}
	oc.subs[key][ch] = struct{}{}
	return ch, func() {
		oc.mu.Lock()
		defer oc.mu.Unlock()
		delete(oc.subs[key], ch)
		if len(oc.subs[key]) == 0 {
			delete(oc.subs, key)
		}
	}
}

// get returns a copy of the cached object name of inf (T: its pointer
// type), or false.
func get[T client.Object](inf cache.SharedIndexInformer, name string) (T, bool) {
	var zero T
	o, ok, err := inf.GetStore().GetByKey(name)
	if err != nil || !ok {
		return zero, false
	}
	return o.(runtime.Object).DeepCopyObject().(T), true
}

// getOrRead is get, else a GET into obj (found false on NotFound): the cache
// may lag behind objects other processes wrote. For names the CO gave, so a
// miss costs one request.
func getOrRead[T client.Object](ctx context.Context, c client.Reader, inf cache.SharedIndexInformer, name string, obj T) (T, bool, error) {
	if o, ok := get[T](inf, name); ok {
		return o, true, nil
	}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return obj, false, nil
		}
		return obj, false, err
	}
	return obj, true, nil
}

// all returns the cached objects of inf, shared with the cache: read them,
// never change them.
func all[T client.Object](inf cache.SharedIndexInformer) []T {
	objs := inf.GetStore().List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(T))
	}
	return out
}
