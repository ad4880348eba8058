package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// ControllerBackend implements driver.Backend on the API server (controller
// mode): the Controller service's calls become LocalVolume and LocalSnapshot
// objects that the node plugins carry out; it never touches a disk.
type ControllerBackend struct {
	c client.WithWatch
	// Wait bounds how long a call waits for a node plugin when the caller's
	// context has no earlier deadline.
	Wait time.Duration
	// MaxVolumeBytes caps single volumes (0: no cap).
	MaxVolumeBytes int64
	// StaleAfter is how old a LocalNode heartbeat may be before its node
	// counts as gone: no capacity, no placement (default StaleAfter).
	StaleAfter time.Duration
	// Ranges asks node plugins for snapshots' block ranges (the
	// SnapshotMetadata service; backend_metadata.go); nil: not served.
	Ranges RangesClient

	cache *objectCache // every read; c only writes (and GETs what the cache cannot know)

	mu      sync.Mutex
	nodes   map[string]*sync.Mutex           // placement is serialized per node
	pending map[string]map[string]unseenSize // by node, volume id: sizes written, not yet cached
	counted map[string]countedSize           // by volume id: what used counts for each cached LocalVolume
	used    map[string]int64                 // by node: Σ counted sizes of its LocalVolumes, in bytes

	// deleted holds the ids this controller deleted (deleteWithIntent), so a
	// repeated delete of one the cache no longer holds needs no GET
	// (csi-provisioner sends about four in five deletes twice). Such an object
	// cannot come back: its data goes first, and a create of the name drops the id.
	deleted *lru.Cache
}

// maxDeletedIDs bounds ControllerBackend.deleted (about 100 bytes each).
const maxDeletedIDs = 10000

// deletedAndGone reports whether this controller deleted id (of the kind
// inf caches) and the cache no longer holds it.
func deletedAndGone[T client.Object](b *ControllerBackend, inf cache.SharedIndexInformer, id string) bool {
	if _, cached := get[T](inf, id); cached {
		return false
	}
	_, deleted := b.deleted.Get(id)
	return deleted
}

// NewControllerBackend connects to the API server with cfg and returns once
// its object cache has listed every kind; the cache runs until ctx is done.
func NewControllerBackend(ctx context.Context, cfg *rest.Config, maxVolumeBytes int64) (*ControllerBackend, error) {
	ctrllog.SetLogger(klog.NewKlogr())
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	b, err := newControllerBackend(ctx, c, maxVolumeBytes)
	if err == nil {
		go b.keepCopies(ctx, copiesEvery)
	}
	return b, err
}

// copiesEvery is how often the controller places the snapshot copies that
// could not be placed when their snapshot was cut.
const copiesEvery = 30 * time.Second

// newControllerBackend is a backend on any client (a fake one in unit tests).
func newControllerBackend(ctx context.Context, c client.WithWatch, maxVolumeBytes int64) (*ControllerBackend, error) {
	b := &ControllerBackend{c: c, Wait: 2 * time.Minute, MaxVolumeBytes: maxVolumeBytes, StaleAfter: StaleAfter, cache: newObjectCache(c),
		nodes: map[string]*sync.Mutex{}, pending: map[string]map[string]unseenSize{},
		counted: map[string]countedSize{}, used: map[string]int64{}, deleted: lru.New(maxDeletedIDs)}
	reg, err := b.cache.volumes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.seen(o, false) },
		UpdateFunc: func(_, o any) { b.seen(o, false) },
		DeleteFunc: func(o any) { b.seen(o, true) },
	})
	if err != nil {
		return nil, err
	}
	// Placement counts what this handler has seen: wait for it too.
	if err := b.cache.start(ctx, reg.HasSynced); err != nil {
		return nil, err
	}
	return b, nil
}

// cachedVolume is the object cache's LocalVolume id (ErrNotFound when it
// has none): for the names CreateVolume checks, new ones mostly.
func (b *ControllerBackend) cachedVolume(id string) (*v1.LocalVolume, error) {
	if !contract.ValidVolumeID(id) {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	lv, ok := get[*v1.LocalVolume](b.cache.volumes, id)
	if !ok {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return lv, nil
}

// getVolume is LocalVolume id from the cache, or from the API server when
// the cache has none (getOrRead): for ids the CO gave.
func (b *ControllerBackend) getVolume(ctx context.Context, id string) (*v1.LocalVolume, error) {
	if !contract.ValidVolumeID(id) {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	lv, ok, err := getOrRead(ctx, b.c, b.cache.volumes, id, &v1.LocalVolume{})
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return lv, nil
}

// liveVolume is getVolume for calls that act on a volume: one whose delete
// was requested is NOT_FOUND for them.
func (b *ControllerBackend) liveVolume(ctx context.Context, id string) (*v1.LocalVolume, error) {
	lv, err := b.getVolume(ctx, id)
	if err == nil && lv.Deleting() {
		return nil, fmt.Errorf("%w: volume %q is being deleted", contract.ErrNotFound, id)
	}
	return lv, err
}

// VolumeByName returns the Ready volume of a CSI name; one still being
// created is left to CreateVolume, which waits for it.
func (b *ControllerBackend) VolumeByName(ctx context.Context, name string) (*contract.Volume, error) {
	lv, err := b.cachedVolume(VolumeIDFor(name))
	if errors.Is(err, contract.ErrNotFound) {
		return nil, nil
	}
	if err != nil || lv.Status.Phase != v1.PhaseReady || lv.Deleting() {
		return nil, err
	}
	return toVolume(lv), nil
}

// Volume implements driver.Backend: only Ready volumes exist for the CO.
func (b *ControllerBackend) Volume(ctx context.Context, id string) (*contract.Volume, error) {
	lv, err := b.getVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	if lv.Status.Phase != v1.PhaseReady || lv.Deleting() {
		return nil, fmt.Errorf("%w: volume %q is %s", contract.ErrNotFound, id, phaseOf(lv.Status.Phase))
	}
	return toVolume(lv), nil
}

// ListVolumes implements driver.Backend (Ready volumes, id order).
func (b *ControllerBackend) ListVolumes(ctx context.Context, after string, limit int) ([]*contract.Volume, string, error) {
	items := all[*v1.LocalVolume](b.cache.volumes)
	sort.Slice(items, func(i, j int) bool { return items[i].Name < items[j].Name })
	var out []*contract.Volume
	for _, lv := range items {
		if lv.Name <= after || lv.Status.Phase != v1.PhaseReady || lv.Deleting() || lv.Spec.MoveOf != "" {
			continue
		}
		if limit > 0 && len(out) == limit {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, toVolume(lv))
	}
	return out, "", nil
}

// CreateVolume implements driver.Backend: it places a LocalVolume (on the
// source's node for a restore or clone) and waits until it is Ready or Failed.
func (b *ControllerBackend) CreateVolume(ctx context.Context, spec contract.CreateSpec, topology *csi.TopologyRequirement) (*contract.Volume, error) {
	id := VolumeIDFor(spec.Name)
	lv, err := b.cachedVolume(id)
	switch {
	case err == nil:
		if lv.Deleting() {
			return nil, fmt.Errorf("%w: volume %s of the same name is still being deleted; retry later", contract.ErrBusy, id)
		}
		if lv.Spec.Size.Value() < spec.SizeBytes || lv.Spec.VolumeMode != volumeMode(spec.AccessType) {
			return nil, fmt.Errorf("%w: volume %q exists with other arguments", contract.ErrExists, spec.Name)
		}
		return b.waitVolume(ctx, id, true)
	case !errors.Is(err, contract.ErrNotFound):
		return nil, err
	}
	var pvc map[string]string
	if spec.PVCName != "" && spec.PVCNamespace != "" {
		pvc = map[string]string{v1.PVCNamespaceAnnotation: spec.PVCNamespace, v1.PVCNameAnnotation: spec.PVCName}
	}
	lv = &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: id, Annotations: pvc},
		Spec: v1.LocalVolumeSpec{
			Size:              quantity(spec.SizeBytes),
			VolumeMode:        volumeMode(spec.AccessType),
			FsType:            spec.FsType,
			Parameters:        spec.Parameters,
			MutableParameters: spec.MutableParameters,
			CSIName:           spec.Name,
		},
	}
	sources, err := b.contentSource(ctx, lv, spec)
	if err != nil {
		return nil, err
	}
	b.deleted.Remove(id)
	if err := b.placeVolume(ctx, lv, sources, topology); err != nil {
		return nil, err
	}
	return b.waitVolume(ctx, id, true)
}

// contentSource sets lv's content source from spec and returns the nodes
// that hold it, the snapshot's own node first, then those with a complete
// copy (none for an empty volume).
func (b *ControllerBackend) contentSource(ctx context.Context, lv *v1.LocalVolume, spec contract.CreateSpec) ([]string, error) {
	switch {
	case spec.SourceSnapshotID != "":
		ls, err := b.liveSnapshot(ctx, spec.SourceSnapshotID)
		if err != nil {
			return nil, err
		}
		lv.Spec.ContentSource = &v1.ContentSource{Snapshot: ls.Name}
		return b.holders(ls), nil
	case spec.SourceVolumeID != "":
		src, err := b.liveVolume(ctx, spec.SourceVolumeID)
		if err != nil {
			return nil, err
		}
		lv.Spec.ContentSource = &v1.ContentSource{Volume: src.Name}
		return []string{src.Spec.Node}, nil
	}
	return nil, nil
}

// remove asks the node plugin to delete a LocalVolume and its data.
func (b *ControllerBackend) remove(ctx context.Context, lv *v1.LocalVolume) error {
	return b.deleteWithIntent(ctx, lv, &lv.Spec.DeleteData)
}

// deleteWithIntent sets obj's spec.deleteData (*intent) in one merge patch
// unless done already and waits until the cache shows it; the node plugin
// then removes the data and the object. No object carries a finalizer, so an
// uninstall deleting the CRDs waits on no node plugin. The patch names obj's
// UID: an object of the same name made since (a moved volume's, on its new
// node) is never marked from a stale copy; that is ErrBusy, to retry.
func (b *ControllerBackend) deleteWithIntent(ctx context.Context, obj client.Object, intent *bool) error {
	if !*intent {
		raw := []byte(`{"spec":{"deleteData":true}}`)
		if uid := obj.GetUID(); uid != "" {
			raw = []byte(fmt.Sprintf(`{"metadata":{"uid":%q},"spec":{"deleteData":true}}`, uid))
		}
		*intent = true
		if err := b.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, raw)); apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
			return fmt.Errorf("%w: %s was replaced since it was read; retry: %v", contract.ErrBusy, obj.GetName(), err)
		} else if err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	b.deleted.Add(obj.GetName(), nil)
	// Read your writes: later calls answer from the cache, where the object
	// must no longer look alive.
	kind, inf := "LocalVolume", b.cache.volumes
	deleting := func(o client.Object) bool { return o.(*v1.LocalVolume).Deleting() }
	if _, ok := obj.(*v1.LocalSnapshot); ok {
		kind, inf = "LocalSnapshot", b.cache.snapshots
		deleting = func(o client.Object) bool { return o.(*v1.LocalSnapshot).Deleting() }
	}
	ctx, cancel := b.waitCtx(ctx)
	defer cancel()
	return b.awaitCache(ctx, kind, inf, obj.GetName(), func(o client.Object, ok bool) (bool, error) {
		return !ok || o.GetUID() != obj.GetUID() || deleting(o), nil
	})
}

// DeleteVolume implements driver.Backend by recording the delete intent
// (deleteWithIntent).
func (b *ControllerBackend) DeleteVolume(ctx context.Context, id string) error {
	// Its moves first: a move's node removes what arrived only while the
	// volume's own object says the volume is elsewhere (deleteMoved).
	for _, mv := range b.movesOf(id) {
		if mv.Annotations[v1.VolumeDeletedAnnotation] != "true" {
			patch := client.MergeFrom(mv.DeepCopy())
			metav1.SetMetaDataAnnotation(&mv.ObjectMeta, v1.VolumeDeletedAnnotation, "true")
			if err := b.c.Patch(ctx, mv, patch); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
		if err := b.remove(ctx, mv); err != nil {
			return fmt.Errorf("delete the move of volume %s to node %s: %w", id, mv.Spec.Node, err)
		}
	}
	if deletedAndGone[*v1.LocalVolume](b, b.cache.volumes, id) {
		return nil // deleted here, and gone since
	}
	lv, err := b.getVolume(ctx, id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	klog.V(2).InfoS("Deleting volume", "volumeID", id, "node", lv.Spec.Node)
	return b.remove(ctx, lv)
}

// ExpandVolume implements driver.Backend: it raises spec.size if the node
// has room and waits for the node to report the capacity.
func (b *ControllerBackend) ExpandVolume(ctx context.Context, id string, size int64) (int64, error) {
	lv, err := b.liveVolume(ctx, id)
	if err != nil {
		return 0, err
	}
	if err := b.notMoving(id); err != nil {
		return 0, err
	}
	if lv.Status.CapacityBytes.Value() >= size {
		return lv.Status.CapacityBytes.Value(), nil
	}
	if size > lv.Spec.Size.Value() {
		// grow updates lv to the patched object: its generation is the
		// one the node's answer must be for.
		if err := b.grow(ctx, lv, size); err != nil {
			return 0, err
		}
	}
	return b.waitExpanded(ctx, id, size, lv.Generation)
}

// ModifyVolume implements driver.Backend: it merges params into
// spec.mutableParameters and waits until the node reports them in effect; one
// the node refuses as INVALID_ARGUMENT is taken back so later ones proceed.
func (b *ControllerBackend) ModifyVolume(ctx context.Context, id string, params map[string]string) error {
	lv, err := b.liveVolume(ctx, id)
	if err != nil {
		return err
	}
	if err := b.notMoving(id); err != nil {
		return err
	}
	before := maps.Clone(lv.Spec.MutableParameters)
	want := contract.MergeMutable(before, params)
	if !maps.Equal(want, before) {
		patch := client.MergeFrom(lv.DeepCopy())
		lv.Spec.MutableParameters = want
		if err := b.c.Patch(ctx, lv, patch); err != nil {
			return err
		}
	}
	got, err := b.waitModified(ctx, id, want, lv.Generation)
	if contract.Code(err) == codes.InvalidArgument && !maps.Equal(want, before) {
		patch := client.MergeFrom(got.DeepCopy())
		undo := got.DeepCopy()
		undo.Spec.MutableParameters = before
		if perr := b.c.Patch(ctx, undo, patch); perr != nil {
			klog.ErrorS(perr, "Cannot take a refused modify back from the LocalVolume spec", "volumeID", id)
		}
	}
	return err
}

// VolumeHealth implements driver.Backend from the object's status and its
// node's heartbeat.
func (b *ControllerBackend) VolumeHealth(ctx context.Context, id string) (contract.Health, error) {
	lv, err := b.liveVolume(ctx, id)
	if err != nil {
		return contract.Health{}, err
	}
	var h contract.Health
	if lv.Status.Phase != v1.PhaseReady {
		h.Problems = append(h.Problems, contract.Problem{Kind: "Inaccessible", Reason: "Not" + v1.PhaseReady, Message: "LocalVolume phase is " + phaseOf(lv.Status.Phase)})
	}
	for _, c := range lv.Status.Conditions {
		if c.Type == "Healthy" && c.Status == metav1.ConditionFalse {
			h.Problems = append(h.Problems, contract.Problem{Kind: "Degraded", Reason: c.Reason, Message: c.Message})
		}
	}
	if r, err := b.room(ctx, lv.Spec.Node); err == nil && r.reason != "" {
		h.Problems = append(h.Problems, contract.Problem{Kind: "Inaccessible", Reason: "NodePluginGone", Message: r.reason})
	}
	return h, nil
}

// NodeKnown reports whether a LocalNode exists for node (ControllerPublish
// answers NOT_FOUND for unknown nodes).
func (b *ControllerBackend) NodeKnown(ctx context.Context, node string) (bool, error) {
	if _, ok := get[*v1.LocalNode](b.cache.nodes, node); ok {
		return true, nil
	}
	// A node plugin that started a moment ago: ask the API server.
	err := b.c.Get(ctx, client.ObjectKey{Name: node}, &v1.LocalNode{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}
