// Package cluster carries localdir to a Kubernetes cluster: the controller
// Deployment records intent in LocalVolume / LocalSnapshot custom resources
// (ControllerBackend) and every node plugin carries out the ones of its own
// node with the same pkg/volume code that all mode calls (NodeAgent).
package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/metrics"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// Scheme knows the localdir types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// VolumeIDFor is the volume_id the controller gives the volume of a CSI
// name: deterministic, so a retried CreateVolume finds the object its first
// attempt created, and of the driver's id shape (vol- + 32 hex digits).
func VolumeIDFor(name string) string {
	h := sha256.Sum256([]byte("volume\x00" + name))
	return "vol-" + hex.EncodeToString(h[:16])
}

// SnapshotIDFor is VolumeIDFor for snapshots (snap- + 32 hex digits).
func SnapshotIDFor(name string) string {
	h := sha256.Sum256([]byte("snapshot\x00" + name))
	return "snap-" + hex.EncodeToString(h[:16])
}

// StaleAfter is how old a LocalNode heartbeat may be before the controller
// treats the node plugin as gone (no capacity, no placement).
const StaleAfter = 3 * time.Minute

// ControllerBackend implements driver.Backend on the API server (controller
// mode). It never touches a disk.
type ControllerBackend struct {
	c client.WithWatch
	// Wait bounds how long a call waits for a node plugin when the caller's
	// context has no earlier deadline.
	Wait time.Duration
	// MaxVolumeBytes caps single volumes (0: no cap).
	MaxVolumeBytes int64

	mu    sync.Mutex
	nodes map[string]*sync.Mutex // placement is serialized per node
}

// NewControllerBackend connects to the API server.
func NewControllerBackend(cfg *rest.Config, maxVolumeBytes int64) (*ControllerBackend, error) {
	ctrllog.SetLogger(klog.NewKlogr())
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, err
	}
	return &ControllerBackend{c: c, Wait: 2 * time.Minute, MaxVolumeBytes: maxVolumeBytes, nodes: map[string]*sync.Mutex{}}, nil
}

func (b *ControllerBackend) nodeLock(node string) *sync.Mutex {
	b.mu.Lock()
	defer b.mu.Unlock()
	l, ok := b.nodes[node]
	if !ok {
		l = &sync.Mutex{}
		b.nodes[node] = l
	}
	return l
}

func accessType(mode string) string {
	if mode == v1.VolumeModeBlock {
		return contract.AccessBlock
	}
	return contract.AccessMount
}

func volumeMode(accessType string) string {
	if accessType == contract.AccessBlock {
		return v1.VolumeModeBlock
	}
	return v1.VolumeModeFilesystem
}

func toVolume(lv *v1.LocalVolume) *contract.Volume {
	v := &contract.Volume{
		ID:            lv.Name,
		Name:          lv.Spec.CSIName,
		CapacityBytes: lv.Spec.Size,
		AccessType:    accessType(lv.Spec.VolumeMode),
		Parameters:    lv.Spec.Parameters,
		Engine:        lv.Spec.Engine,
		CreatedAt:     lv.CreationTimestamp.UTC(),
		Node:          lv.Spec.Node,
	}
	if lv.Status.CapacityBytes > v.CapacityBytes {
		v.CapacityBytes = lv.Status.CapacityBytes
	}
	if cs := lv.Spec.ContentSource; cs != nil {
		v.SourceSnapshotID, v.SourceVolumeID = cs.Snapshot, cs.Volume
	}
	return v
}

func toSnapshot(ls *v1.LocalSnapshot) *contract.Snapshot {
	s := &contract.Snapshot{
		ID:             ls.Name,
		Name:           ls.Spec.CSIName,
		SourceVolumeID: ls.Spec.SourceVolume,
		SizeBytes:      ls.Status.SizeBytes,
		CreatedAt:      ls.CreationTimestamp.UTC(),
		Node:           ls.Spec.Node,
	}
	if ls.Status.CreationTime != nil {
		s.CreatedAt = ls.Status.CreationTime.UTC()
	}
	return s
}

func (b *ControllerBackend) getVolume(ctx context.Context, id string) (*v1.LocalVolume, error) {
	if !volume.ValidVolumeID(id) {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	lv := &v1.LocalVolume{}
	err := b.c.Get(ctx, client.ObjectKey{Name: id}, lv)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	return lv, err
}

func (b *ControllerBackend) getSnapshot(ctx context.Context, id string) (*v1.LocalSnapshot, error) {
	if !volume.ValidSnapshotID(id) {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	ls := &v1.LocalSnapshot{}
	err := b.c.Get(ctx, client.ObjectKey{Name: id}, ls)
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
	}
	return ls, err
}

// VolumeByName returns the Ready volume of a CSI name; one still being
// created is left to CreateVolume, which waits for it.
func (b *ControllerBackend) VolumeByName(ctx context.Context, name string) (*contract.Volume, error) {
	lv, err := b.getVolume(ctx, VolumeIDFor(name))
	if errors.Is(err, contract.ErrNotFound) {
		return nil, nil
	}
	if err != nil || lv.Status.Phase != v1.PhaseReady || lv.DeletionTimestamp != nil {
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
	if lv.Status.Phase != v1.PhaseReady || lv.DeletionTimestamp != nil {
		return nil, fmt.Errorf("%w: volume %q is %s", contract.ErrNotFound, id, phaseOf(lv.Status.Phase))
	}
	return toVolume(lv), nil
}

func phaseOf(p string) string {
	if p == "" {
		return v1.PhasePending
	}
	return p
}

// ListVolumes implements driver.Backend (Ready volumes, id order).
func (b *ControllerBackend) ListVolumes(ctx context.Context, after string, limit int) ([]*contract.Volume, string, error) {
	list := &v1.LocalVolumeList{}
	if err := b.c.List(ctx, list); err != nil {
		return nil, "", err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	var out []*contract.Volume
	for i := range list.Items {
		lv := &list.Items[i]
		if lv.Name <= after || lv.Status.Phase != v1.PhaseReady || lv.DeletionTimestamp != nil {
			continue
		}
		if limit > 0 && len(out) == limit {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, toVolume(lv))
	}
	return out, "", nil
}

// nodeRoom is what one node can still take, in bytes.
type nodeRoom struct {
	node      string
	available int64 // min(capacity − Σ sizes of its LocalVolumes, free)
	maxVolume int64 // 0: no cap
	reason    string
}

// room computes a node's free capacity from its LocalNode and the
// LocalVolumes placed on it, read from the API server (not a cache) so a
// placement made a moment ago is counted.
func (b *ControllerBackend) room(ctx context.Context, node string) (nodeRoom, error) {
	r := nodeRoom{node: node}
	ln := &v1.LocalNode{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: node}, ln); err != nil {
		if apierrors.IsNotFound(err) {
			r.reason = "no LocalNode: the localdir node plugin is not running there"
			return r, nil
		}
		return r, err
	}
	if time.Since(ln.Status.Heartbeat.Time) > StaleAfter {
		r.reason = fmt.Sprintf("the node plugin's last heartbeat was %s ago", time.Since(ln.Status.Heartbeat.Time).Round(time.Second))
		return r, nil
	}
	list := &v1.LocalVolumeList{}
	if err := b.c.List(ctx, list, client.MatchingLabels{v1.NodeLabel: node}); err != nil {
		return r, err
	}
	var used int64
	for _, lv := range list.Items {
		if lv.Status.Phase != v1.PhaseFailed {
			used += max(lv.Spec.Size, lv.Status.CapacityBytes)
		}
	}
	r.available = max(min(ln.Status.CapacityBytes-used, ln.Status.FreeBytes), 0)
	r.maxVolume = ln.Status.MaxVolumeBytes
	if b.MaxVolumeBytes > 0 && (r.maxVolume == 0 || b.MaxVolumeBytes < r.maxVolume) {
		r.maxVolume = b.MaxVolumeBytes
	}
	return r, nil
}

func nodeOf(t *csi.Topology) (string, bool) {
	for k, v := range t.GetSegments() {
		if k != contract.TopologyKey {
			return "", false
		}
		return v, v != ""
	}
	return "", false
}

// candidates lists the nodes a volume may go to, in order: the preferred
// topologies first (in their order, restricted to the requisite ones when
// those are given), then the other admissible nodes — the requisite ones,
// or without requirements every node with a LocalNode — most room first.
func (b *ControllerBackend) candidates(ctx context.Context, req *csi.TopologyRequirement) ([]string, error) {
	var first, rest []string
	seen := map[string]bool{}
	requisite := map[string]bool{}
	for _, t := range req.GetRequisite() {
		if n, ok := nodeOf(t); ok {
			requisite[n] = true
		}
	}
	for _, t := range req.GetPreferred() {
		if n, ok := nodeOf(t); ok && !seen[n] && (len(requisite) == 0 || requisite[n]) {
			seen[n] = true
			first = append(first, n)
		}
	}
	switch {
	case len(req.GetRequisite()) > 0:
		for n := range requisite {
			if !seen[n] {
				rest = append(rest, n)
			}
		}
	case len(req.GetPreferred()) == 0:
		nodes := &v1.LocalNodeList{}
		if err := b.c.List(ctx, nodes); err != nil {
			return nil, err
		}
		for _, n := range nodes.Items {
			rest = append(rest, n.Name)
		}
	}
	room := map[string]int64{}
	for _, n := range rest {
		r, err := b.room(ctx, n)
		if err != nil {
			return nil, err
		}
		room[n] = r.available
	}
	sort.SliceStable(rest, func(i, j int) bool {
		if room[rest[i]] != room[rest[j]] {
			return room[rest[i]] > room[rest[j]]
		}
		return rest[i] < rest[j]
	})
	return append(first, rest...), nil
}

// CreateVolume implements driver.Backend: it places the volume (on the
// source's node for a restore or clone), records a LocalVolume and waits
// until that node's plugin reports it Ready or Failed.
func (b *ControllerBackend) CreateVolume(ctx context.Context, spec volume.CreateSpec, topology *csi.TopologyRequirement) (*contract.Volume, error) {
	id := VolumeIDFor(spec.Name)
	lv, err := b.getVolume(ctx, id)
	switch {
	case err == nil:
		if lv.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.Aborted, "volume %s of the same name is still being deleted; retry later", id)
		}
		if lv.Spec.Size < spec.SizeBytes || lv.Spec.VolumeMode != volumeMode(spec.AccessType) {
			return nil, fmt.Errorf("%w: volume %q exists with other arguments", contract.ErrExists, spec.Name)
		}
		return b.waitVolume(ctx, id)
	case !errors.Is(err, contract.ErrNotFound):
		return nil, err
	}
	lv = &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: id},
		Spec: v1.LocalVolumeSpec{
			Size:       spec.SizeBytes,
			VolumeMode: volumeMode(spec.AccessType),
			Parameters: spec.Parameters,
			CSIName:    spec.Name,
		},
	}
	var sourceNode string
	switch {
	case spec.SourceSnapshotID != "":
		ls, err := b.getSnapshot(ctx, spec.SourceSnapshotID)
		if err != nil {
			return nil, err
		}
		sourceNode = ls.Spec.Node
		lv.Spec.ContentSource = &v1.ContentSource{Snapshot: ls.Name}
	case spec.SourceVolumeID != "":
		src, err := b.getVolume(ctx, spec.SourceVolumeID)
		if err != nil {
			return nil, err
		}
		sourceNode = src.Spec.Node
		lv.Spec.ContentSource = &v1.ContentSource{Volume: src.Name}
	}
	nodes, err := b.candidates(ctx, topology)
	if err != nil {
		return nil, err
	}
	if sourceNode != "" {
		if len(topology.GetRequisite())+len(topology.GetPreferred()) > 0 && !slices.Contains(nodes, sourceNode) {
			// RESOURCE_EXHAUSTED, not NOT_FOUND: the provisioner then
			// reschedules instead of giving up (kubernetes-csi/csi-driver-host-path#651).
			return nil, fmt.Errorf("%w: the content source lives on node %q, which the accessibility requirements exclude", contract.ErrNoSpace, sourceNode)
		}
		nodes = []string{sourceNode}
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%w: no node runs the localdir node plugin (no LocalNode objects)", contract.ErrNoSpace)
	}
	var refused []string
	for _, node := range nodes {
		placed, why, err := b.place(ctx, lv, node)
		if err != nil {
			return nil, err
		}
		if placed {
			klog.V(2).InfoS("Volume placed", "volumeID", id, "node", node, "size", spec.SizeBytes)
			return b.waitVolume(ctx, id)
		}
		refused = append(refused, fmt.Sprintf("%s: %s", node, why))
	}
	return nil, fmt.Errorf("%w: no node can take %d bytes (%s); free space on a node, pick a smaller size, or add nodes", contract.ErrNoSpace, spec.SizeBytes, strings.Join(refused, "; "))
}

// place creates lv on node if the node has room. Decisions for one node
// are serialized, and room() reads the API server, so concurrent creates
// never oversubscribe a node.
func (b *ControllerBackend) place(ctx context.Context, lv *v1.LocalVolume, node string) (bool, string, error) {
	l := b.nodeLock(node)
	l.Lock()
	defer l.Unlock()
	r, err := b.room(ctx, node)
	if err != nil {
		return false, "", err
	}
	switch {
	case r.reason != "":
		return false, r.reason, nil
	case r.maxVolume > 0 && lv.Spec.Size > r.maxVolume:
		return false, fmt.Sprintf("volumes are limited to %d bytes", r.maxVolume), nil
	case lv.Spec.Size > r.available:
		return false, fmt.Sprintf("%d bytes available", r.available), nil
	}
	obj := lv.DeepCopy()
	obj.Spec.Node = node
	obj.Labels = map[string]string{v1.NodeLabel: node}
	if err := b.c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return false, "", err
	}
	return true, "", nil
}

// waitCtx bounds a wait by the caller's deadline or b.Wait.
func (b *ControllerBackend) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, b.Wait)
}

// waitFor watches the object named name of list type l until done says so.
func (b *ControllerBackend) waitFor(ctx context.Context, l client.ObjectList, name string, done func() (bool, error), get func() error) error {
	ctx, cancel := b.waitCtx(ctx)
	defer cancel()
	w, err := b.c.Watch(ctx, l, &client.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name)})
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		if err := get(); err != nil {
			return err
		}
		if ok, err := done(); ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return status.Errorf(codes.DeadlineExceeded, "timed out waiting for the node plugin on %s; the call can be retried and will pick the same object up", name)
		case ev, ok := <-w.ResultChan():
			if !ok {
				w, err = b.c.Watch(ctx, l, &client.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name)})
				if err != nil {
					return err
				}
				continue
			}
			if ev.Type == watch.Deleted {
				return status.Errorf(codes.Aborted, "%s was deleted while waiting for it", name)
			}
		}
	}
}

// failure turns a Failed object's status into the gRPC error the node
// reported.
func failure(errorCode string, conds []metav1.Condition, what string) error {
	msg := what + " failed on its node"
	for _, c := range conds {
		if c.Type == v1.ConditionReady && c.Message != "" {
			msg = what + ": " + c.Message
		}
	}
	code := codes.Internal
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == errorCode {
			code = c
		}
	}
	return status.Error(code, msg)
}

func (b *ControllerBackend) waitVolume(ctx context.Context, id string) (*contract.Volume, error) {
	lv := &v1.LocalVolume{}
	err := b.waitFor(ctx, &v1.LocalVolumeList{}, id,
		func() (bool, error) {
			switch lv.Status.Phase {
			case v1.PhaseReady:
				return true, nil
			case v1.PhaseFailed:
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "volume "+id)
			}
			return false, nil
		},
		func() error { return b.c.Get(ctx, client.ObjectKey{Name: id}, lv) })
	if err != nil {
		if lv.Status.Phase == v1.PhaseFailed {
			// Remove the failed attempt so a retry starts afresh; it holds
			// no data.
			b.remove(ctx, lv)
		}
		return nil, err
	}
	return toVolume(lv), nil
}

// remove records the delete intent on a LocalVolume and deletes it.
func (b *ControllerBackend) remove(ctx context.Context, lv *v1.LocalVolume) error {
	return b.deleteWithIntent(ctx, lv, &lv.Spec.DeleteData)
}

// deleteWithIntent sets the object's spec.deleteData (*intent, a field of
// obj) and the v1alpha1.Finalizer in one patch unless both are there, then
// deletes obj: the node plugin removes data only for objects carrying that
// intent, and the finalizer keeps the object until it has. Objects nobody
// asked to delete never carry the finalizer (an uninstall deleting the
// CRDs does not wait on node plugins).
func (b *ControllerBackend) deleteWithIntent(ctx context.Context, obj client.Object, intent *bool) error {
	if !*intent || !controllerutil.ContainsFinalizer(obj, v1.Finalizer) {
		patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
		*intent = true
		controllerutil.AddFinalizer(obj, v1.Finalizer)
		if err := b.c.Patch(ctx, obj, patch); err != nil {
			return client.IgnoreNotFound(err)
		}
	}
	uid := obj.GetUID()
	return client.IgnoreNotFound(b.c.Delete(ctx, obj, client.Preconditions{UID: &uid}))
}

// DeleteVolume implements driver.Backend: the delete intent is recorded on
// the object (spec.deleteData and the finalizer), then the object deleted;
// the node plugin removes the data and then the finalizer, now or when it
// comes back.
func (b *ControllerBackend) DeleteVolume(ctx context.Context, id string) error {
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

// ExpandVolume implements driver.Backend: it checks the node has room for
// the growth, raises spec.size and waits for the node to report the new
// capacity.
func (b *ControllerBackend) ExpandVolume(ctx context.Context, id string, size int64) (int64, error) {
	lv, err := b.getVolume(ctx, id)
	if err != nil {
		return 0, err
	}
	if size <= lv.Spec.Size {
		return max(lv.Spec.Size, lv.Status.CapacityBytes), nil
	}
	l := b.nodeLock(lv.Spec.Node)
	l.Lock()
	r, err := b.room(ctx, lv.Spec.Node)
	if err == nil && (r.reason != "" || size-lv.Spec.Size > r.available) {
		err = fmt.Errorf("%w: node %s has %d bytes available, the expansion needs %d more %s", contract.ErrNoSpace, lv.Spec.Node, r.available, size-lv.Spec.Size, r.reason)
	}
	if err == nil {
		patch := client.MergeFrom(lv.DeepCopy())
		lv.Spec.Size = size
		err = b.c.Patch(ctx, lv, patch)
	}
	l.Unlock()
	if err != nil {
		return 0, err
	}
	err = b.waitFor(ctx, &v1.LocalVolumeList{}, id,
		func() (bool, error) {
			if lv.Status.CapacityBytes >= size {
				return true, nil
			}
			if lv.Status.ObservedGeneration >= lv.Generation && lv.Status.ErrorCode != "" {
				return true, failure(lv.Status.ErrorCode, lv.Status.Conditions, "expansion of "+id)
			}
			return false, nil
		},
		func() error { return b.c.Get(ctx, client.ObjectKey{Name: id}, lv) })
	if err != nil {
		return 0, err
	}
	return lv.Status.CapacityBytes, nil
}

// Capacity implements driver.Backend from the LocalNode of the segment's
// node (all nodes: the sum, with the largest single volume).
func (b *ControllerBackend) Capacity(ctx context.Context, segment *csi.Topology) (int64, int64, error) {
	var nodes []string
	if segment != nil {
		n, ok := nodeOf(segment)
		if !ok {
			return 0, 0, nil
		}
		nodes = []string{n}
	} else {
		list := &v1.LocalNodeList{}
		if err := b.c.List(ctx, list); err != nil {
			return 0, 0, err
		}
		for _, n := range list.Items {
			nodes = append(nodes, n.Name)
		}
	}
	var total, largest int64
	for _, n := range nodes {
		r, err := b.room(ctx, n)
		if err != nil {
			return 0, 0, err
		}
		total += r.available
		one := r.available
		if r.maxVolume > 0 {
			one = min(one, r.maxVolume)
		}
		largest = max(largest, one)
	}
	return total, largest, nil
}

// VolumeHealth implements driver.Backend from the object's status and its
// node's heartbeat.
func (b *ControllerBackend) VolumeHealth(ctx context.Context, id string) (volume.Health, error) {
	lv, err := b.getVolume(ctx, id)
	if err != nil {
		return volume.Health{}, err
	}
	var h volume.Health
	if lv.Status.Phase != v1.PhaseReady {
		h.Problems = append(h.Problems, volume.Problem{Kind: "Inaccessible", Reason: "Not" + v1.PhaseReady, Message: "LocalVolume phase is " + phaseOf(lv.Status.Phase)})
	}
	for _, c := range lv.Status.Conditions {
		if c.Type == "Healthy" && c.Status == metav1.ConditionFalse {
			h.Problems = append(h.Problems, volume.Problem{Kind: "Degraded", Reason: c.Reason, Message: c.Message})
		}
	}
	if r, err := b.room(ctx, lv.Spec.Node); err == nil && r.reason != "" {
		h.Problems = append(h.Problems, volume.Problem{Kind: "Inaccessible", Reason: "NodePluginGone", Message: r.reason})
	}
	return h, nil
}

// SnapshotByName implements driver.Backend (Ready snapshots only).
func (b *ControllerBackend) SnapshotByName(ctx context.Context, name string) (*contract.Snapshot, error) {
	ls, err := b.getSnapshot(ctx, SnapshotIDFor(name))
	if errors.Is(err, contract.ErrNotFound) {
		return nil, nil
	}
	if err != nil || !ls.Status.ReadyToUse || ls.DeletionTimestamp != nil {
		return nil, err
	}
	return toSnapshot(ls), nil
}

// Snapshot implements driver.Backend.
func (b *ControllerBackend) Snapshot(ctx context.Context, id string) (*contract.Snapshot, error) {
	ls, err := b.getSnapshot(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ls.Status.ReadyToUse || ls.DeletionTimestamp != nil {
		return nil, fmt.Errorf("%w: snapshot %q is not ready", contract.ErrNotFound, id)
	}
	return toSnapshot(ls), nil
}

// ListSnapshots implements driver.Backend.
func (b *ControllerBackend) ListSnapshots(ctx context.Context, after string, limit int, src string) ([]*contract.Snapshot, string, error) {
	list := &v1.LocalSnapshotList{}
	if err := b.c.List(ctx, list); err != nil {
		return nil, "", err
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	var out []*contract.Snapshot
	for i := range list.Items {
		ls := &list.Items[i]
		if ls.Name <= after || !ls.Status.ReadyToUse || ls.DeletionTimestamp != nil || (src != "" && ls.Spec.SourceVolume != src) {
			continue
		}
		if limit > 0 && len(out) == limit {
			return out, out[len(out)-1].ID, nil
		}
		out = append(out, toSnapshot(ls))
	}
	return out, "", nil
}

// CreateSnapshot implements driver.Backend: a LocalSnapshot on the source's
// node, then a wait for readyToUse.
func (b *ControllerBackend) CreateSnapshot(ctx context.Context, name, src string, topology *csi.TopologyRequirement) (*contract.Snapshot, error) {
	id := SnapshotIDFor(name)
	ls, err := b.getSnapshot(ctx, id)
	switch {
	case err == nil:
		if ls.Spec.SourceVolume != src {
			return nil, fmt.Errorf("%w: snapshot %q exists for volume %s", contract.ErrExists, name, ls.Spec.SourceVolume)
		}
		if ls.DeletionTimestamp != nil {
			return nil, status.Errorf(codes.Aborted, "snapshot %s of the same name is still being deleted; retry later", id)
		}
	case errors.Is(err, contract.ErrNotFound):
		lv, err := b.Volume(ctx, src)
		if err != nil {
			return nil, err
		}
		if !contract.Reachable(topology, lv.Node) {
			return nil, fmt.Errorf("%w: the source volume lives on node %q, which the accessibility requirements exclude", contract.ErrNoSpace, lv.Node)
		}
		ls = &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: lv.Node}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: src, Node: lv.Node, CSIName: name},
		}
		if err := b.c.Create(ctx, ls); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	default:
		return nil, err
	}
	ls = &v1.LocalSnapshot{}
	err = b.waitFor(ctx, &v1.LocalSnapshotList{}, id,
		func() (bool, error) {
			if ls.Status.ReadyToUse {
				return true, nil
			}
			if ls.Status.Phase == v1.PhaseFailed {
				return true, failure(ls.Status.ErrorCode, ls.Status.Conditions, "snapshot "+id)
			}
			return false, nil
		},
		func() error { return b.c.Get(ctx, client.ObjectKey{Name: id}, ls) })
	if err != nil {
		if ls.Status.Phase == v1.PhaseFailed {
			b.removeSnapshot(ctx, ls)
		}
		return nil, err
	}
	return toSnapshot(ls), nil
}

func (b *ControllerBackend) removeSnapshot(ctx context.Context, ls *v1.LocalSnapshot) error {
	return b.deleteWithIntent(ctx, ls, &ls.Spec.DeleteData)
}

// DeleteSnapshot implements driver.Backend like DeleteVolume.
func (b *ControllerBackend) DeleteSnapshot(ctx context.Context, id string) error {
	ls, err := b.getSnapshot(ctx, id)
	if errors.Is(err, contract.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return b.removeSnapshot(ctx, ls)
}

// NodeKnown reports whether a LocalNode exists for node (ControllerPublish
// answers NOT_FOUND for unknown nodes).
func (b *ControllerBackend) NodeKnown(ctx context.Context, node string) (bool, error) {
	err := b.c.Get(ctx, client.ObjectKey{Name: node}, &v1.LocalNode{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// MetricSamples reports, for localdir_* gauges in controller mode, each
// node's capacity figures from its LocalNode and the objects by phase.
func (b *ControllerBackend) MetricSamples(ctx context.Context) []metrics.Sample {
	var out []metrics.Sample
	nodes := &v1.LocalNodeList{}
	if err := b.c.List(ctx, nodes); err == nil {
		for _, n := range nodes.Items {
			out = append(out,
				metrics.Sample{Desc: metrics.CapacityDesc, Value: float64(n.Status.CapacityBytes), Labels: []string{n.Name}},
				metrics.Sample{Desc: metrics.FreeDesc, Value: float64(n.Status.FreeBytes), Labels: []string{n.Name}},
				metrics.Sample{Desc: metrics.OrphansDesc, Value: float64(len(n.Status.Orphans)), Labels: []string{n.Name}})
			if r, err := b.room(ctx, n.Name); err == nil {
				out = append(out, metrics.Sample{Desc: metrics.AllocatableDesc, Value: float64(r.available), Labels: []string{n.Name}})
			}
		}
	}
	type key struct{ node, phase string }
	vols, snaps := map[key]int{}, map[key]int{}
	lvs := &v1.LocalVolumeList{}
	if err := b.c.List(ctx, lvs); err == nil {
		for _, lv := range lvs.Items {
			vols[key{lv.Spec.Node, phaseOf(lv.Status.Phase)}]++
		}
	}
	lss := &v1.LocalSnapshotList{}
	if err := b.c.List(ctx, lss); err == nil {
		for _, ls := range lss.Items {
			snaps[key{ls.Spec.Node, phaseOf(ls.Status.Phase)}]++
		}
	}
	for k, n := range vols {
		out = append(out, metrics.Sample{Desc: metrics.VolumesDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	for k, n := range snaps {
		out = append(out, metrics.Sample{Desc: metrics.SnapshotsDesc, Value: float64(n), Labels: []string{k.node, k.phase}})
	}
	return out
}
