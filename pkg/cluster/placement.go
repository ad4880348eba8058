package cluster

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Placement. A node's room comes from its LocalVolumes' sizes as the cache
// showed them (a running sum per node, O(1) per create) plus the sizes this
// process wrote that the cache has not shown yet (pending), under a per-node
// lock, so concurrent creates and growths never oversubscribe a node.

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

// nodeRoom is what one node can still take, in bytes.
type nodeRoom struct {
	node      string
	capacity  int64 // what all its volumes may reserve together (LocalNode status)
	available int64 // min(capacity − Σ sizes of its LocalVolumes, free − headroom − placed since)
	maxVolume int64 // 0: no cap
	reason    string
}

// unseenSize is a volume size the controller wrote (a create, an
// expansion) that its object cache may not show yet.
type unseenSize struct {
	size    int64
	written time.Time
}

// unseenFor is how long a pending size counts at most: only an object created
// and deleted before its size was recorded is never seen to go.
const unseenFor = time.Minute

// countedSize is what a node's used bytes count for one cached
// LocalVolume: max(spec.size, status.capacityBytes), nothing while Failed.
type countedSize struct {
	node   string
	spec   int64 // spec.size in bytes
	size   int64 // what used counts: max(spec.size, status.capacityBytes)
	failed bool  // status.phase Failed: counted as 0
}

func (c countedSize) bytes() int64 {
	if c.failed {
		return 0
	}
	return c.size
}

// wrote records that volume id on node was written with size bytes, unless
// the cache shows that size already.
func (b *ControllerBackend) wrote(node, id string, size int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.counted[id]; ok && c.spec >= size {
		return
	}
	if b.pending[node] == nil {
		b.pending[node] = map[string]unseenSize{}
	}
	b.pending[node][id] = unseenSize{size, time.Now()}
}

// seen is the LocalVolume event handler: it keeps each node's used bytes and
// forgets a pending size once the cache shows it.
func (b *ControllerBackend) seen(o any, deleted bool) {
	lv, ok := o.(*v1.LocalVolume)
	if !ok { // a deletion the watch missed: the object's last known state
		if d, isTomb := o.(cache.DeletedFinalStateUnknown); isTomb {
			lv, ok = d.Obj.(*v1.LocalVolume)
		}
		if !ok {
			return
		}
		deleted = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if prev, ok := b.counted[lv.Name]; ok {
		b.used[prev.node] -= prev.bytes()
	}
	if deleted {
		delete(b.counted, lv.Name)
	} else {
		c := countedSize{node: lv.Spec.Node, spec: lv.Spec.Size.Value(), failed: lv.Status.Phase == v1.PhaseFailed}
		c.size = max(c.spec, lv.Status.CapacityBytes.Value())
		b.counted[lv.Name] = c
		b.used[c.node] += c.bytes()
	}
	if p, ok := b.pending[lv.Spec.Node][lv.Name]; ok && (deleted || lv.Spec.Size.Value() >= p.size) {
		delete(b.pending[lv.Spec.Node], lv.Name)
	}
}

// usedOn is the bytes node's LocalVolumes take: the cached ones' counted sizes,
// grown to the pending sizes the cache does not show yet, plus pending volumes
// it does not show at all.
func (b *ControllerBackend) usedOn(node string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	used := b.used[node]
	for id, p := range b.pending[node] {
		if time.Since(p.written) > unseenFor {
			delete(b.pending[node], id)
			continue
		}
		switch c, ok := b.counted[id]; {
		case !ok || c.node != node:
			used += p.size
		case !c.failed:
			used += max(p.size-c.size, 0)
		}
	}
	return used
}

// room computes a node's free capacity from its LocalNode and the
// LocalVolumes placed on it (usedOn).
func (b *ControllerBackend) room(_ context.Context, node string) (nodeRoom, error) {
	r := nodeRoom{node: node}
	ln, ok := get[*v1.LocalNode](b.cache.nodes, node)
	if !ok {
		r.reason = "no LocalNode: the localdir node plugin is not running there"
		return r, nil
	}
	if time.Since(ln.Status.Heartbeat.Time) > b.StaleAfter {
		r.reason = fmt.Sprintf("the node plugin's last heartbeat was %s ago", time.Since(ln.Status.Heartbeat.Time).Round(time.Second))
		return r, nil
	}
	used := b.usedOn(node)
	// The heartbeat's free space, less what its volumes may still write, less
	// what was placed or grown since.
	pending := used - ln.Status.AllocatedBytes.Value()
	free := ln.Status.FreeBytes.Value() - ln.Status.HeadroomBytes.Value() - pending
	r.capacity = ln.Status.CapacityBytes.Value()
	r.available = max(min(r.capacity-used, free), 0)
	r.maxVolume = ln.Status.MaxVolumeBytes.Value()
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

// candidates lists the nodes a volume may go to: the preferred topologies in
// order (restricted to the requisite ones), then the other admissible nodes
// (requisite, or every LocalNode), most room first.
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
		for _, n := range all[*v1.LocalNode](b.cache.nodes) {
			rest = append(rest, n.Name)
		}
	}
	if err := b.sortByRoom(ctx, rest); err != nil {
		return nil, err
	}
	return append(first, rest...), nil
}

// sortByRoom orders nodes most room first, then by name.
func (b *ControllerBackend) sortByRoom(ctx context.Context, nodes []string) error {
	room := map[string]int64{}
	for _, n := range nodes {
		r, err := b.room(ctx, n)
		if err != nil {
			return err
		}
		room[n] = r.available
	}
	sort.SliceStable(nodes, func(i, j int) bool {
		if room[nodes[i]] != room[nodes[j]] {
			return room[nodes[i]] > room[nodes[j]]
		}
		return nodes[i] < nodes[j]
	})
	return nil
}

// placeVolume creates lv on the first candidate node that has room for it.
// A restore or clone (sources: the nodes holding its source, the snapshot's
// own first, then its copies') goes to a node holding the source when the
// requirements allow it and name no other first (a local copy is instant);
// on any other node it is made by a transfer from the first holder that
// can send it there (transferable).
func (b *ControllerBackend) placeVolume(ctx context.Context, lv *v1.LocalVolume, sources []string, topology *csi.TopologyRequirement) error {
	nodes, err := b.candidates(ctx, topology)
	if err != nil {
		return err
	}
	for _, src := range slices.Backward(sources) {
		if len(topology.GetPreferred()) == 0 && (len(topology.GetRequisite()) == 0 || slices.Contains(nodes, src)) {
			nodes = append([]string{src}, slices.DeleteFunc(nodes, func(n string) bool { return n == src })...)
		}
	}
	if len(nodes) == 0 {
		return fmt.Errorf("%w: no node runs the localdir node plugin (no LocalNode objects)", contract.ErrNoSpace)
	}
	var refused []string
	for _, node := range nodes {
		sourceNode := ""
		if slices.Contains(sources, node) {
			sourceNode = node // a local copy
		} else if len(sources) > 0 {
			var whys []string
			for _, src := range sources {
				why := b.transferable(src, node)
				if why == "" {
					sourceNode = src
					break
				}
				whys = append(whys, why)
			}
			if sourceNode == "" {
				refused = append(refused, fmt.Sprintf("%s: %s", node, strings.Join(whys, ", ")))
				continue
			}
		}
		placed, why, err := b.place(ctx, lv, node, sourceNode)
		if err != nil {
			return err
		}
		if placed {
			klog.V(2).InfoS("Volume placed", "volumeID", lv.Name, "node", node, "size", lv.Spec.Size.Value(), "sourceNode", sourceNode)
			return nil
		}
		refused = append(refused, fmt.Sprintf("%s: %s", node, why))
	}
	return fmt.Errorf("%w: no node can take %d bytes (%s); free space on a node, pick a smaller size, or add nodes", contract.ErrNoSpace, lv.Spec.Size.Value(), strings.Join(refused, "; "))
}

// transferable says why a volume cannot be copied from node src to node dst
// ("" when it can): both must serve the node-to-node channel, and src must
// be heard from.
func (b *ControllerBackend) transferable(src, dst string) string {
	for _, n := range []string{src, dst} {
		ln, ok := get[*v1.LocalNode](b.cache.nodes, n)
		if !ok {
			return fmt.Sprintf("the content source is on node %s and node %s has no LocalNode", src, n)
		}
		if ln.Status.Transfer == nil {
			return fmt.Sprintf("the content source is on node %s and node %s serves no transfer channel", src, n)
		}
		if n == src && time.Since(ln.Status.Heartbeat.Time) > b.StaleAfter {
			return fmt.Sprintf("the content source is on node %s, whose node plugin has not reported since %s", src, ln.Status.Heartbeat.Format(time.RFC3339))
		}
	}
	return ""
}

// place creates lv on node if the node has room, as a transfer from
// sourceNode when that is another node. Decisions for one node are
// serialized and reserve the size they grant before the object is written,
// so the API writes run in parallel, not one by one under the node's lock.
func (b *ControllerBackend) place(ctx context.Context, lv *v1.LocalVolume, node, sourceNode string) (bool, string, error) {
	release, why, err := b.reserve(ctx, lv, node)
	if why != "" || err != nil {
		return false, why, err
	}
	obj := lv.DeepCopy()
	obj.Spec.Node = node
	obj.Labels = map[string]string{v1.NodeLabel: node}
	for k, v := range lv.Labels {
		if k != v1.NodeLabel {
			obj.Labels[k] = v
		}
	}
	if sourceNode != "" && node != sourceNode {
		obj.Spec.ContentSource.Node = sourceNode
	}
	if err := b.c.Create(ctx, obj); err != nil {
		// An object of an earlier attempt counts once the cache shows
		// it (that attempt reserved its own size).
		release()
		if !apierrors.IsAlreadyExists(err) {
			return false, "", err
		}
	}
	return true, "", nil
}

// reserve records lv's size as placed on node (wrote) if the node has room,
// under the node's lock, and returns the undo for a write that failed (an
// earlier attempt's pending size is pending again); otherwise it says why not.
func (b *ControllerBackend) reserve(ctx context.Context, lv *v1.LocalVolume, node string) (release func(), why string, err error) {
	l := b.nodeLock(node)
	l.Lock()
	defer l.Unlock()
	r, err := b.room(ctx, node)
	if err != nil {
		return nil, "", err
	}
	switch {
	case r.reason != "":
		return nil, r.reason, nil
	case r.maxVolume > 0 && lv.Spec.Size.Value() > r.maxVolume:
		return nil, fmt.Sprintf("volumes are limited to %d bytes", r.maxVolume), nil
	case lv.Spec.Size.Value() > r.available:
		return nil, fmt.Sprintf("%d bytes available", r.available), nil
	}
	b.mu.Lock()
	prev, hadPrev := b.pending[node][lv.Name]
	b.mu.Unlock()
	b.wrote(node, lv.Name, lv.Spec.Size.Value())
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if hadPrev {
			b.pending[node][lv.Name] = prev
		} else {
			delete(b.pending[node], lv.Name)
		}
	}, "", nil
}

// grow raises lv's spec.size to size if its node has room for the growth
// (serialized with the node's placements, like place).
func (b *ControllerBackend) grow(ctx context.Context, lv *v1.LocalVolume, size int64) error {
	l := b.nodeLock(lv.Spec.Node)
	l.Lock()
	defer l.Unlock()
	r, err := b.room(ctx, lv.Spec.Node)
	if err != nil {
		return err
	}
	// Past the node's whole capacity or the volume cap: no retry can
	// succeed (OUT_OF_RANGE, which Kubernetes marks infeasible so the user
	// may ask for less); short of room now is RESOURCE_EXHAUSTED, retried.
	switch {
	case r.reason == "" && size > r.capacity:
		return fmt.Errorf("%w: volume %s cannot grow to %d bytes on node %s: the node holds %d bytes in all (%d more available now)",
			contract.ErrOutOfRange, lv.Name, size, lv.Spec.Node, r.capacity, r.available)
	case r.reason == "" && r.maxVolume > 0 && size > r.maxVolume:
		return fmt.Errorf("%w: volume %s cannot grow to %d bytes on node %s: volumes there are limited to %d bytes",
			contract.ErrOutOfRange, lv.Name, size, lv.Spec.Node, r.maxVolume)
	}
	if need := size - lv.Spec.Size.Value(); r.reason != "" || need > r.available {
		return fmt.Errorf("%w: node %s has %d bytes available, the expansion needs %d more %s", contract.ErrNoSpace, lv.Spec.Node, r.available, need, r.reason)
	}
	patch := client.MergeFrom(lv.DeepCopy())
	lv.Spec.Size = quantity(size)
	if err := b.c.Patch(ctx, lv, patch); err != nil {
		return err
	}
	b.wrote(lv.Spec.Node, lv.Name, size)
	return nil
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
		for _, n := range all[*v1.LocalNode](b.cache.nodes) {
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
