package rbac

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

// mustDeny expects the node-scope policy's refusal: Forbidden, with a
// message that names what was refused.
func mustDeny(t *testing.T, err error, what, wantMsg string) {
	t.Helper()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), wantMsg) {
		t.Errorf("%s: got %v, want Forbidden saying %q", what, err, wantMsg)
	}
}

func mergePatch(p string) client.Patch { return client.RawPatch(types.MergePatchType, []byte(p)) }

// TestNodePluginWritesOnlyItsOwnNode: with deploy/kubernetes' admission
// policy, the node plugin of node-b (a token bound to its pod, as the
// kubelet gives it) cannot touch node-a's objects, cannot change any
// object's spec or node label (spec.deleteData is the controller's), can
// delete only what the controller marked for deletion, and a token of the
// node plugin's ServiceAccount bound to no pod can write nothing. Its own
// node's objects stay writable as the node agent needs, and the
// controller's writes pass.
func TestNodePluginWritesOnlyItsOwnNode(t *testing.T) {
	env := clustertest.Start(t)
	ctx := context.Background()
	ctrl := clientFor(t, env.ControllerIdentity(t).Config)
	nodeA := clientFor(t, env.NodeIdentity(t, "node-a").Config)
	nodeB := clientFor(t, env.NodeIdentity(t, "node-b").Config)
	unbound := clientFor(t, env.UnboundNodeToken(t).Config)
	admin := clientFor(t, env.Config)

	// The API server put each pod's node in its token.
	for node, id := range map[string]clustertest.Identity{"node-a": env.NodeIdentity(t, "node-a"), "node-b": env.NodeIdentity(t, "node-b")} {
		if got := who(t, id.Config).Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != node {
			t.Fatalf("token of %s's pod carries node-name %v", node, got)
		}
	}

	newLV := func(name, node string) *v1.LocalVolume {
		return &v1.LocalVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: node}},
			Spec:       v1.LocalVolumeSpec{Node: node, Size: resource.MustParse("1Mi"), VolumeMode: v1.VolumeModeFilesystem, CSIName: name},
		}
	}
	lvA := newLV("vol-0000000000000000000000000000000a", "node-a")
	lvB := newLV("vol-0000000000000000000000000000000b", "node-b")
	mustAllow(t, ctrl.Create(ctx, lvA), "controller: create node-a's LocalVolume")
	mustAllow(t, ctrl.Create(ctx, lvB), "controller: create node-b's LocalVolume")
	lsA := &v1.LocalSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: "snap-0000000000000000000000000000000a", Labels: map[string]string{v1.NodeLabel: "node-a"}},
		Spec:       v1.LocalSnapshotSpec{SourceVolume: lvA.Name, Node: "node-a", CSIName: "snap-a"},
	}
	mustAllow(t, ctrl.Create(ctx, lsA), "controller: create node-a's LocalSnapshot")
	gA := &v1.LocalGroupSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: "group-a"},
		Spec:       v1.LocalGroupSnapshotSpec{Node: "node-a", CSIName: "group-a", Volumes: []string{lvA.Name}, Snapshots: []string{"snap-0000000000000000000000000000001a"}},
	}
	mustAllow(t, ctrl.Create(ctx, gA), "controller: create node-a's LocalGroupSnapshot")
	mustAllow(t, nodeA.Create(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}), "node-a: create its LocalNode")

	// node-b on node-a's objects: every write refused, naming the owner.
	const other = "it belongs to node node-a"
	mustDeny(t, nodeB.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"spec":{"deleteData":true}}`)), "node-b: set deleteData on node-a's LocalVolume", other)
	mustDeny(t, nodeB.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"metadata":{"annotations":{"x":"y"}}}`)), "node-b: annotate node-a's LocalVolume", other)
	mustDeny(t, nodeB.Status().Patch(ctx, lvA.DeepCopy(), mergePatch(`{"status":{"phase":"Failed"}}`)), "node-b: LocalVolume status of node-a", other)
	mustDeny(t, nodeB.Status().Patch(ctx, lsA.DeepCopy(), mergePatch(`{"status":{"phase":"Failed"}}`)), "node-b: LocalSnapshot status of node-a", other)
	mustDeny(t, nodeB.Status().Patch(ctx, gA.DeepCopy(), mergePatch(`{"status":{"phase":"Failed"}}`)), "node-b: LocalGroupSnapshot status of node-a", other)
	mustDeny(t, nodeB.Status().Patch(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, mergePatch(`{"status":{"engine":"dir"}}`)), "node-b: node-a's LocalNode status", other)
	mustDeny(t, nodeB.Create(ctx, newLV("vol-0000000000000000000000000000002a", "node-a")), "node-b: create a LocalVolume on node-a", other)
	mustDeny(t, nodeB.Create(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-c"}}), "node-b: create node-c's LocalNode", "it belongs to node node-c")
	// A delete the controller asked for is still node-a's to carry out.
	mustAllow(t, ctrl.Patch(ctx, lsA.DeepCopy(), mergePatch(`{"spec":{"deleteData":true}}`)), "controller: record a delete of node-a's LocalSnapshot")
	mustDeny(t, nodeB.Delete(ctx, lsA.DeepCopy()), "node-b: delete node-a's LocalSnapshot", other)
	// A token that names no node writes nothing, not even its own.
	mustDeny(t, unbound.Patch(ctx, lvB.DeepCopy(), mergePatch(`{"metadata":{"annotations":{"x":"y"}}}`)), "unbound token: annotate a LocalVolume", "no node name")

	// node-a on its own objects: what the node agent does is allowed ...
	mustAllow(t, nodeA.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"metadata":{"annotations":{"x":"y"}}}`)), "node-a: annotate its LocalVolume")
	mustAllow(t, nodeA.Status().Patch(ctx, lvA.DeepCopy(), mergePatch(`{"status":{"phase":"Ready"}}`)), "node-a: its LocalVolume's status")
	mustAllow(t, nodeA.Status().Patch(ctx, gA.DeepCopy(), mergePatch(`{"status":{"phase":"Pending"}}`)), "node-a: its LocalGroupSnapshot's status")
	mustAllow(t, nodeA.Status().Patch(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, mergePatch(`{"status":{"engine":"dir"}}`)), "node-a: its LocalNode's status")
	readopted := newLV("vol-0000000000000000000000000000003a", "node-a")
	readopted.Labels[v1.ReadoptedLabel] = "true"
	mustAllow(t, nodeA.Create(ctx, readopted), "node-a: re-create a LocalVolume of its own")
	mustAllow(t, nodeA.Delete(ctx, lsA.DeepCopy()), "node-a: delete its LocalSnapshot after the controller's delete")
	// ... but not what only the controller may decide.
	const spec = "may not change the spec or the node label"
	mustDeny(t, nodeA.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"spec":{"deleteData":true}}`)), "node-a: set deleteData on its LocalVolume", spec)
	mustDeny(t, nodeA.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"spec":{"size":"2Mi"}}`)), "node-a: resize its LocalVolume", spec)
	mustDeny(t, nodeA.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"metadata":{"labels":{"localdir.csi.dev/node":"node-b"}}}`)), "node-a: relabel its LocalVolume", spec)
	mustDeny(t, nodeA.Delete(ctx, lvA.DeepCopy()), "node-a: delete its LocalVolume without a delete request", "only after the controller set spec.deleteData")
	unlabelled := newLV("vol-0000000000000000000000000000004a", "node-a")
	unlabelled.Labels = nil
	mustDeny(t, nodeA.Create(ctx, unlabelled), "node-a: create a LocalVolume without the node label", "only with the label")
	marked := newLV("vol-0000000000000000000000000000005a", "node-a")
	marked.Spec.DeleteData = true
	mustDeny(t, nodeA.Create(ctx, marked), "node-a: create a LocalVolume marked for deletion", "without spec.deleteData")
	// A node plugin cannot make another node serve it data: only the
	// controller names a source node (pkg/transfer authorizes by it).
	pulling := newLV("vol-0000000000000000000000000000006a", "node-a")
	pulling.Spec.ContentSource = &v1.ContentSource{Volume: "vol-0000000000000000000000000000001b", Node: "node-b"}
	mustDeny(t, nodeA.Create(ctx, pulling), "node-a: create a LocalVolume pulling node-b's data", "only the controller asks another node for data")
	// Nor make itself the target of a move (even without a source node).
	moving := newLV(contract.VolumeMoveName("vol-0000000000000000000000000000001b", "node-a"), "node-a")
	moving.Spec.MoveOf = "vol-0000000000000000000000000000001b"
	mustDeny(t, nodeA.Create(ctx, moving), "node-a: create a move of node-b's volume", "only the controller moves a volume")
	const snapB = "snap-0000000000000000000000000000001b"
	copying := &v1.LocalSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: contract.SnapshotCopyName(snapB, "node-a"), Labels: map[string]string{v1.NodeLabel: "node-a"}},
		Spec:       v1.LocalSnapshotSpec{SourceVolume: "vol-0000000000000000000000000000001b", Node: "node-a", CopyOf: snapB},
	}
	mustDeny(t, nodeA.Create(ctx, copying), "node-a: create a copy of node-b's snapshot", "only the controller asks another node for a snapshot copy")
	if err := admin.Get(ctx, client.ObjectKeyFromObject(copying), &v1.LocalSnapshot{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused copy exists: %v", err)
	}
	if err := admin.Create(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}); err != nil {
		t.Fatal(err)
	}
	mustDeny(t, nodeA.Status().Patch(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, mergePatch(`{"status":{"transfer":{"address":"10.0.0.9:9811","certificate":"forged"}}}`)), "node-a: publish a transfer certificate for node-b", "it belongs to node node-b")

	// Nothing a refused call aimed at changed.
	got := &v1.LocalVolume{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(lvA), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.DeleteData || got.Spec.Size.Cmp(resource.MustParse("1Mi")) != 0 || got.Labels[v1.NodeLabel] != "node-a" || got.Status.Phase != v1.PhaseReady {
		t.Errorf("node-a's LocalVolume changed: spec %+v, labels %v, phase %q", got.Spec, got.Labels, got.Status.Phase)
	}
	for _, name := range []string{"vol-0000000000000000000000000000002a", "vol-0000000000000000000000000000004a", "vol-0000000000000000000000000000005a", "vol-0000000000000000000000000000006a"} {
		if err := admin.Get(ctx, client.ObjectKey{Name: name}, &v1.LocalVolume{}); !apierrors.IsNotFound(err) {
			t.Errorf("LocalVolume %s: %v, want it never created", name, err)
		}
	}
	if err := admin.Get(ctx, client.ObjectKey{Name: "node-c"}, &v1.LocalNode{}); !apierrors.IsNotFound(err) {
		t.Errorf("LocalNode node-c: %v, want it never created", err)
	}

	// The controller's own writes are not the policy's business.
	mustAllow(t, ctrl.Patch(ctx, lvA.DeepCopy(), mergePatch(`{"spec":{"size":"2Mi","deleteData":true}}`)), "controller: expand and delete node-a's LocalVolume")
	mustAllow(t, nodeA.Delete(ctx, lvA.DeepCopy()), "node-a: delete its LocalVolume after the controller's delete")
}
