package cluster

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// The in-place move of a volume, on the controller: a PVC annotated
// v1.MoveToAnnotation=<node> gets its volume moved to that node, keeping
// the PVC and its PV. The steps, each one safe to repeat after a crash:
//
//  1. Checks: a bound PV of this driver, its LocalVolume Ready, no pod
//     scheduled that uses the PVC, a channel between the nodes, room on
//     the target, and an API server that lets a PV's node affinity change
//     (the MutablePVNodeAffinity feature gate; a dry-run update tells).
//  2. The PV's node affinity is set to a term no node matches (MovingToKey),
//     so a pod started now waits, Pending; the pods are checked again.
//  3. A move LocalVolume (volume_move.go) is placed on the target, which
//     pulls the volume over the node-to-node channel and reports Ready
//     once every byte has arrived and been verified.
//  4. The PV's node affinity is set to the target; the volume's own
//     LocalVolume is deleted with its data on the old node; once it is
//     gone it is made again on the target, where its data already is; the
//     move object goes.
//
// Until step 4 the old node keeps the data and the PV can go back to it: a
// move that fails (the source lost, no room) or is called off (the
// annotation removed) puts the PV's node affinity back and removes what
// arrived on the target.

// MovingToKey is the node-affinity key of a PV whose volume is being moved:
// no node has it, so no pod of the PVC is scheduled until the move is done.
const MovingToKey = "localdir.csi.dev/moving-to"

// moveRecheck is how often a move in progress is looked at again;
// refusedRecheck how often a refused one whose cause may go away (a pod,
// the room, the target's node plugin) is.
const (
	moveRecheck    = 2 * time.Second
	refusedRecheck = 10 * time.Second
)

// Mover carries out the in-place moves of the PVCs of one driver.
type Mover struct {
	b      *ControllerBackend
	kube   kubernetes.Interface
	driver string
	rec    record.EventRecorder
	pvcs   cache.SharedIndexInformer

	mu    sync.Mutex
	queue workqueue.TypedRateLimitingInterface[string] // while leading; nil otherwise
	told  map[string]string                            // PVC or pod key → the last Event message given, so each is given once
}

// MoverLease names the Lease the controller replicas elect the one mover
// with (in Namespace, held as Identity).
type MoverLease struct {
	Namespace, Identity string
}

// moverLeaseName is the Lease of the mover's leader election.
const moverLeaseName = "localdir-mover"

// StartMover runs the in-place mover of driverName's PVCs until ctx is
// done: with lease, only while this replica holds it (one mover acts at a
// time, as one of each sidecar does); without, always.
func (b *ControllerBackend) StartMover(ctx context.Context, cfg *rest.Config, driverName string, lease *MoverLease) (*Mover, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	bc := record.NewBroadcaster(record.WithContext(ctx))
	bc.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	m := &Mover{
		b: b, kube: kube, driver: driverName,
		rec:  bc.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "localdir-controller"}),
		told: map[string]string{},
	}
	f := informers.NewSharedInformerFactory(kube, 10*time.Minute)
	m.pvcs = f.Core().V1().PersistentVolumeClaims().Informer()
	enqueue := func(o any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(o); err == nil {
			m.mu.Lock()
			if m.queue != nil {
				m.queue.Add(key)
			}
			m.mu.Unlock()
		}
	}
	if _, err := m.pvcs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue,
	}); err != nil {
		return nil, err
	}
	f.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		bc.Shutdown()
	}()
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), m.pvcs.HasSynced) {
			return
		}
		if lease == nil {
			m.lead(ctx)
			return
		}
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: lease.Namespace, Name: moverLeaseName},
			Client:     kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: lease.Identity},
		}
		for ctx.Err() == nil {
			leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
				Lock: lock, ReleaseOnCancel: true, Name: moverLeaseName,
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: m.lead,
					OnStoppedLeading: func() { klog.InfoS("Volume mover: not the leader (any more)", "identity", lease.Identity) },
				},
			})
		}
	}()
	return m, nil
}

// lead runs the mover until ctx is done: a new queue holding every PVC,
// one worker.
func (m *Mover) lead(ctx context.Context) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	m.mu.Lock()
	m.queue = q
	m.told = map[string]string{}
	m.mu.Unlock()
	for _, key := range m.pvcs.GetIndexer().ListKeys() {
		q.Add(key)
	}
	klog.InfoS("Volume mover: leading")
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		m.queue = nil
		m.mu.Unlock()
		q.ShutDown()
	}()
	for m.next(ctx, q) {
	}
}

func (m *Mover) next(ctx context.Context, q workqueue.TypedRateLimitingInterface[string]) bool {
	key, quit := q.Get()
	if quit {
		return false
	}
	defer q.Done(key)
	again, err := m.sync(ctx, key)
	switch {
	case err != nil:
		klog.ErrorS(err, "Volume move: retrying", "pvc", key)
		q.AddRateLimited(key)
	case again > 0:
		q.Forget(key)
		q.AddAfter(key, again)
	default:
		q.Forget(key)
	}
	return true
}

// sync takes one PVC's move one step on; again: when to look again (0:
// at the PVC's next change).
func (m *Mover) sync(ctx context.Context, key string) (again time.Duration, err error) {
	o, exists, err := m.pvcs.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		m.forget(key)
		return 0, err
	}
	pvc := o.(*corev1.PersistentVolumeClaim)
	target := pvc.Annotations[v1.MoveToAnnotation]
	if target == "" && !m.b.anyMoves() {
		return 0, nil // nothing asked, nothing to call off
	}
	if pvc.Spec.VolumeName == "" || pvc.Status.Phase != corev1.ClaimBound {
		if target != "" {
			m.refuse(pvc, "the PVC is not bound to a PersistentVolume yet")
		}
		return 0, nil
	}
	pv, err := m.kube.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != m.driver {
		if target != "" {
			m.refuse(pvc, "its PersistentVolume "+pv.Name+" is not a volume of "+m.driver)
		}
		return 0, nil
	}
	id := pv.Spec.CSI.VolumeHandle
	lv, hasLV := get[*v1.LocalVolume](m.b.cache.volumes, id)
	moves := m.b.movesOf(id)
	pvNode, blocked := affinityOf(pv)
	// A move whose PV points at its node already is past the point of no
	// return: it is finished whatever the annotation says now.
	for _, mv := range moves {
		if pvNode == mv.Spec.Node && !blocked {
			target = mv.Spec.Node
		}
	}
	for _, mv := range moves {
		if mv.Spec.Node != target && !mv.Deleting() {
			if err := m.callOff(ctx, pvc, pv, mv, lv); err != nil {
				return 0, err
			}
		}
	}
	var mv *v1.LocalVolume
	waiting := false // a called-off move to target is still being removed
	for _, o := range moves {
		switch {
		case target == "" || o.Spec.Node != target:
		case o.Deleting():
			waiting = true
		default:
			mv = o
		}
	}
	if mv == nil && blocked && hasLV && !lv.Deleting() {
		// No move runs (called off, or the controller stopped between
		// blocking the PV and placing the move): the PV goes back.
		if err := m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node); err != nil {
			return 0, err
		}
		pvNode, blocked = lv.Spec.Node, false
	}
	if target == "" {
		return 0, nil
	}
	switch {
	case hasLV && lv.Spec.Node == target && !lv.Deleting():
		return 0, m.finish(ctx, pvc, pv, lv, moves)
	case mv == nil && waiting:
		return moveRecheck, nil
	case mv == nil:
		return m.start(ctx, pvc, pv, lv, hasLV, target)
	case mv.Status.Phase == v1.PhaseFailed:
		if blocked && hasLV && !lv.Deleting() {
			if err := m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node); err != nil {
				return 0, err
			}
		}
		m.event(pvc, pvcKey(pvc), corev1.EventTypeWarning, "VolumeMoveFailed", "moving volume %s to node %s failed: %s; its data stays on node %s. Remove the %s annotation to clear this, or set it again to retry.",
			id, target, readyMessage(mv), mv.Spec.ContentSource.Node, v1.MoveToAnnotation)
		return 0, nil
	case mv.Status.Phase != v1.PhaseReady:
		if !blocked {
			if err := m.setAffinity(ctx, pv, MovingToKey, target); err != nil {
				return 0, err
			}
		}
		return moveRecheck, m.tellWaitingPods(ctx, pvc, id, target)
	case hasLV && !lv.Deleting():
		// Verified on the target: the PV follows, then the old copy goes —
		// unless a pod got to the volume on its old node meanwhile (a
		// scheduler's stale cache, a pod bound by hand): then the copy
		// may be older than the data, and the move is called off.
		if pvNode != target || blocked {
			if users, err := m.podsUsing(ctx, pvc); err != nil {
				return 0, err
			} else if len(users) > 0 {
				m.event(pvc, pvcKey(pvc), corev1.EventTypeWarning, "VolumeMoveFailed", "moving volume %s to node %s failed: %s; its data stays on node %s",
					id, target, inUse(users), lv.Spec.Node)
				return 0, m.callOff(ctx, pvc, pv, mv, lv)
			}
			if err := m.setAffinity(ctx, pv, contract.TopologyKey, target); err != nil {
				return 0, err
			}
		}
		klog.InfoS("Volume move: the copy is verified; removing the volume from its old node", "volumeID", id, "from", lv.Spec.Node, "to", target)
		return moveRecheck, m.b.remove(ctx, lv.DeepCopy())
	case hasLV:
		return moveRecheck, nil // the old node is removing its data
	case pvNode != target || blocked:
		// The volume's own object went before the PV followed the move:
		// it was deleted (DeleteVolume), which removes the moves too.
		return 0, nil
	default:
		// The old copy is gone: the volume's own object again, on the target.
		obj := &v1.LocalVolume{
			ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: target}, Annotations: mv.Annotations},
			Spec:       *mv.Spec.DeepCopy(),
		}
		obj.Spec.MoveOf, obj.Spec.ContentSource, obj.Spec.DeleteData = "", nil, false
		if err := m.b.c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, err
		}
		return moveRecheck, nil
	}
}

// start checks that volume id of pvc can move to target and starts the move.
func (m *Mover) start(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, lv *v1.LocalVolume, hasLV bool, target string) (time.Duration, error) {
	id := pv.Spec.CSI.VolumeHandle
	switch {
	case !hasLV || lv.Deleting():
		m.refuse(pvc, "volume "+id+" has no LocalVolume, or it is being deleted")
		return 0, nil
	case lv.Status.Phase != v1.PhaseReady:
		m.refuse(pvc, "volume "+id+" is not Ready on node "+lv.Spec.Node)
		return refusedRecheck, nil
	}
	if why := m.b.transferable(lv.Spec.Node, target); why != "" {
		m.refuse(pvc, why)
		return refusedRecheck, nil
	}
	if users, err := m.podsUsing(ctx, pvc); err != nil {
		return 0, err
	} else if len(users) > 0 {
		m.refuse(pvc, inUse(users))
		return refusedRecheck, nil
	}
	// Can a PV's node affinity change here at all?
	trial := pv.DeepCopy()
	trial.Spec.NodeAffinity = nodeAffinity(MovingToKey, target)
	if _, err := m.kube.CoreV1().PersistentVolumes().Update(ctx, trial, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); apierrors.IsInvalid(err) {
		m.refuse(pvc, "this cluster does not let a PersistentVolume's node affinity change (the MutablePVNodeAffinity feature gate of the API server is off): "+
			"move it with a snapshot and a restore on the other node instead (docs/troubleshooting.md, \"I must drain a node\")")
		return 0, nil
	} else if err != nil {
		return 0, err
	}
	if err := m.setAffinity(ctx, pv, MovingToKey, target); err != nil {
		return 0, err
	}
	if users, err := m.podsUsing(ctx, pvc); err != nil || len(users) > 0 {
		// A pod was scheduled before the PV changed: give it back its node.
		if rerr := m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node); rerr != nil {
			return 0, rerr
		}
		if err == nil {
			m.refuse(pvc, inUse(users))
		}
		return refusedRecheck, err
	}
	mv := &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: contract.VolumeMoveName(id, target), Labels: map[string]string{v1.MoveOfLabel: id}, Annotations: lv.Annotations},
		Spec:       *lv.Spec.DeepCopy(),
	}
	mv.Spec.MoveOf, mv.Spec.ContentSource, mv.Spec.DeleteData = id, &v1.ContentSource{Volume: id}, false
	placed, why, err := m.b.place(ctx, mv, target, lv.Spec.Node)
	if err == nil && !placed {
		m.refuse(pvc, fmt.Sprintf("node %s cannot take %d bytes: %s", target, lv.Spec.Size.Value(), why))
		err = m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node)
		return refusedRecheck, err
	}
	if err != nil {
		return 0, err
	}
	m.event(pvc, pvcKey(pvc), corev1.EventTypeNormal, "VolumeMoveStarted", "moving volume %s from node %s to node %s; a pod started for this PVC meanwhile waits until it is done", id, lv.Spec.Node, target)
	klog.InfoS("Volume move started", "volumeID", id, "from", lv.Spec.Node, "to", target, "pvc", klog.KObj(pvc))
	return moveRecheck, m.tellWaitingPods(ctx, pvc, id, target)
}

func inUse(users []string) string {
	return "pod " + users[0] + " uses it: only a volume no pod uses can move; stop the pod (scale its workload to 0) and the move starts"
}

// finish completes a move that has made the target the volume's node: the
// PV points there, the move objects go (they hold no data of their own).
func (m *Mover) finish(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, lv *v1.LocalVolume, moves []*v1.LocalVolume) error {
	if node, blocked := affinityOf(pv); node != lv.Spec.Node || blocked {
		if err := m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node); err != nil {
			return err
		}
	}
	for _, mv := range moves {
		if mv.Spec.Node != lv.Spec.Node {
			continue
		}
		if err := m.b.c.Delete(ctx, mv); client.IgnoreNotFound(err) != nil {
			return err
		}
		m.event(pvc, pvcKey(pvc), corev1.EventTypeNormal, "VolumeMoved", "volume %s moved to node %s from node %s; its data there is removed", lv.Name, lv.Spec.Node, mv.Spec.ContentSource.Node)
		klog.InfoS("Volume moved", "volumeID", lv.Name, "to", lv.Spec.Node, "pvc", klog.KObj(pvc))
	}
	return nil
}

// callOff ends move mv before its target became the volume's node: the PV
// points at the volume's node again and what arrived on the target goes.
func (m *Mover) callOff(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, mv, lv *v1.LocalVolume) error {
	if _, blocked := affinityOf(pv); blocked && lv != nil && !lv.Deleting() {
		if err := m.setAffinity(ctx, pv, contract.TopologyKey, lv.Spec.Node); err != nil {
			return err
		}
	}
	klog.InfoS("Volume move called off", "volumeID", mv.Spec.MoveOf, "to", mv.Spec.Node, "pvc", klog.KObj(pvc))
	m.event(pvc, pvcKey(pvc), corev1.EventTypeNormal, "VolumeMoveCalledOff", "the move of volume %s to node %s is called off; the volume stays where it is", mv.Spec.MoveOf, mv.Spec.Node)
	return m.b.remove(ctx, mv.DeepCopy())
}

// tellWaitingPods gives each pod that waits for the move an Event saying so.
func (m *Mover) tellWaitingPods(ctx context.Context, pvc *corev1.PersistentVolumeClaim, id, target string) error {
	pods, err := m.kube.CoreV1().Pods(pvc.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" && usesClaim(p, pvc.Name) && p.DeletionTimestamp == nil {
			m.event(p, "pod/"+string(p.UID), corev1.EventTypeNormal, "WaitingForVolumeMove",
				"PVC %s: volume %s is being moved to node %s; this pod is scheduled once the move is done", pvc.Name, id, target)
		}
	}
	return nil
}

// podsUsing lists the pods of pvc's namespace that use it, are scheduled
// and have not finished.
func (m *Mover) podsUsing(ctx context.Context, pvc *corev1.PersistentVolumeClaim) ([]string, error) {
	pods, err := m.kube.CoreV1().Pods(pvc.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		if !usesClaim(&p, pvc.Name) || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || p.Spec.NodeName == "" {
			continue
		}
		out = append(out, p.Name+" (node "+p.Spec.NodeName+")")
	}
	return out, nil
}

// usesClaim says whether pod p uses PVC claim: by name, or as a generic
// ephemeral volume (whose PVC is named <pod>-<volume>).
func usesClaim(p *corev1.Pod, claim string) bool {
	return slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
		return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == claim ||
			v.Ephemeral != nil && p.Name+"-"+v.Name == claim
	})
}

// setAffinity makes pv's node affinity the one term key In [node].
func (m *Mover) setAffinity(ctx context.Context, pv *corev1.PersistentVolume, key, node string) error {
	if n, blocked := affinityOf(pv); n == node && blocked == (key == MovingToKey) {
		return nil
	}
	pv.Spec.NodeAffinity = nodeAffinity(key, node)
	out, err := m.kube.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("set the node affinity of PersistentVolume %s to %s=%s: %w", pv.Name, key, node, err)
	}
	*pv = *out
	klog.InfoS("Volume move: PersistentVolume node affinity set", "pv", pv.Name, "key", key, "node", node)
	return nil
}

func nodeAffinity(key, node string) *corev1.VolumeNodeAffinity {
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
}

// affinityOf is the node pv's node affinity names (by the topology key or
// MovingToKey; blocked: the latter), "" when it names none or several.
func affinityOf(pv *corev1.PersistentVolume) (node string, blocked bool) {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return "", false
	}
	exprs := na.Required.NodeSelectorTerms[0].MatchExpressions
	if len(exprs) != 1 || exprs[0].Operator != corev1.NodeSelectorOpIn || len(exprs[0].Values) != 1 {
		return "", false
	}
	switch exprs[0].Key {
	case contract.TopologyKey:
		return exprs[0].Values[0], false
	case MovingToKey:
		return exprs[0].Values[0], true
	}
	return "", false
}

// refuse tells pvc why its move cannot start (once per reason).
func (m *Mover) refuse(pvc *corev1.PersistentVolumeClaim, why string) {
	m.event(pvc, pvcKey(pvc), corev1.EventTypeWarning, "VolumeMoveRefused", "cannot move the volume to node %s: %s", pvc.Annotations[v1.MoveToAnnotation], why)
}

// event records an Event on obj unless the same one was the last given
// under key.
func (m *Mover) event(obj runtime.Object, key, typ, reason, format string, args ...any) {
	msg := reason + ": " + fmt.Sprintf(format, args...)
	m.mu.Lock()
	if m.told[key] == msg {
		m.mu.Unlock()
		return
	}
	m.told[key] = msg
	m.mu.Unlock()
	m.rec.Eventf(obj, typ, reason, format, args...)
}

func pvcKey(pvc *corev1.PersistentVolumeClaim) string { return pvc.Namespace + "/" + pvc.Name }

func (m *Mover) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.told, key)
}

// notMoving is ErrBusy while volume id is being moved: its size and
// mutable parameters are those of the move until it is done.
func (b *ControllerBackend) notMoving(id string) error {
	for _, mv := range b.movesOf(id) {
		if !mv.Deleting() && mv.Status.Phase != v1.PhaseFailed {
			return fmt.Errorf("%w: volume %s is being moved to node %s; retry once the move is done", contract.ErrBusy, id, mv.Spec.Node)
		}
	}
	return nil
}

// anyMoves says whether the cache holds a move object.
func (b *ControllerBackend) anyMoves() bool {
	return slices.ContainsFunc(all[*v1.LocalVolume](b.cache.volumes), func(lv *v1.LocalVolume) bool { return lv.Spec.MoveOf != "" })
}

// movesOf is every move object of volume id in the cache, copied out of
// it: those named for their node, moving that volume (only the controller
// makes them; anything else is ignored).
func (b *ControllerBackend) movesOf(id string) []*v1.LocalVolume {
	var out []*v1.LocalVolume
	for _, lv := range all[*v1.LocalVolume](b.cache.volumes) {
		cs := lv.Spec.ContentSource
		if lv.Spec.MoveOf == id && lv.Name == contract.VolumeMoveName(id, lv.Spec.Node) && cs != nil && cs.Volume == id && cs.Snapshot == "" {
			out = append(out, lv.DeepCopy())
		}
	}
	return out
}

// readyMessage is the message of mv's Ready condition.
func readyMessage(mv *v1.LocalVolume) string {
	for _, c := range mv.Status.Conditions {
		if c.Type == v1.ConditionReady {
			return c.Message
		}
	}
	return mv.Status.Phase
}
