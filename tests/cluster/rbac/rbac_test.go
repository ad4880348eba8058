// Package rbac checks that the cluster tests run the localdir plugins with
// the permissions of deploy/kubernetes, not as admin: the API server
// authorizes with RBAC, the identities clustertest gives the controller and
// the node plugin are the ServiceAccounts of the manifests, they can do
// what their ClusterRoles allow and are refused everything else.
package rbac

import (
	"context"
	"fmt"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

func clientFor(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, apiextensionsv1.AddToScheme, corev1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(rest.CopyConfig(cfg), client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// who asks the API server who cfg authenticates as (SelfSubjectReview).
func who(t *testing.T, cfg *rest.Config) authnv1.UserInfo {
	t.Helper()
	cs, err := kubernetes.NewForConfig(rest.CopyConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return r.Status.UserInfo
}

func mustForbid(t *testing.T, err error, what string) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: got %v, want Forbidden", what, err)
	}
}

func mustAllow(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v, want it allowed", what, err)
	}
}

func TestPluginsRunWithTheDeployRBAC(t *testing.T) {
	env := clustertest.Start(t)
	ctrlID, nodeID := env.ControllerIdentity(t), env.NodeIdentity(t, "node-rbac")
	ctx := context.Background()

	// The identities are the ServiceAccounts deploy/kubernetes runs the
	// controller Deployment and the node DaemonSet as.
	for _, c := range []struct {
		id   clustertest.Identity
		want string
	}{{ctrlID, "system:serviceaccount:localdir:localdir-controller"}, {nodeID, "system:serviceaccount:localdir:localdir-node"}} {
		if c.id.User != c.want {
			t.Errorf("identity %q, want %q", c.id.User, c.want)
		}
		if got := who(t, c.id.Config); got.Username != c.want {
			t.Errorf("the API server sees %q (groups %v), want %q", got.Username, got.Groups, c.want)
		}
	}

	admin := clientFor(t, env.Config)
	ctrl := clientFor(t, ctrlID.Config)
	node := clientFor(t, nodeID.Config)

	// What the node plugin's ClusterRole allows.
	mustAllow(t, node.List(ctx, &v1.LocalVolumeList{}), "node: list LocalVolumes")
	ln := &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-rbac"}}
	mustAllow(t, node.Create(ctx, ln), "node: create its LocalNode")
	// What the controller's allows.
	lv := &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-00000000000000000000000000000001", Labels: map[string]string{v1.NodeLabel: "node-rbac"}},
		Spec:       v1.LocalVolumeSpec{Node: "node-rbac", Size: resource.MustParse("1Mi"), VolumeMode: v1.VolumeModeFilesystem, CSIName: "rbac"},
	}
	mustAllow(t, ctrl.Create(ctx, lv), "controller: create a LocalVolume")
	mustAllow(t, ctrl.List(ctx, &v1.LocalNodeList{}), "controller: list LocalNodes")
	// The controller's object cache lists and watches every kind.
	watcher, err := client.NewWithWatch(ctrlID.Config, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []client.ObjectList{&v1.LocalNodeList{}, &v1.LocalVolumeList{}, &v1.LocalSnapshotList{}} {
		w, err := watcher.Watch(ctx, l)
		mustAllow(t, err, fmt.Sprintf("controller: watch %T", l))
		if err == nil {
			w.Stop()
		}
	}

	// The controller's certificates: the controller updates them, node
	// plugins read them and may not change them.
	cm := &corev1.ConfigMap{}
	mustAllow(t, ctrl.Get(ctx, client.ObjectKey{Namespace: "localdir", Name: cluster.ControllerCertsConfigMap}, cm), "controller: get its certificates")
	cm.Data = map[string]string{"replica": "pem"}
	mustAllow(t, ctrl.Update(ctx, cm), "controller: update its certificates")
	ncm := &corev1.ConfigMap{}
	mustAllow(t, node.Get(ctx, client.ObjectKey{Namespace: "localdir", Name: cluster.ControllerCertsConfigMap}, ncm), "node: get the controller's certificates")
	ncm.Data["forged"] = "pem"
	mustForbid(t, node.Update(ctx, ncm), "node: update the controller's certificates")
	mustForbid(t, node.Get(ctx, client.ObjectKey{Namespace: "localdir", Name: "kube-root-ca.crt"}, &corev1.ConfigMap{}), "node: get another ConfigMap")

	// /metrics: both check each scrape with the API server, and scrapers
	// get their own ClusterRole.
	mustReviewScrapes(t, "controller", ctrlID.Config)
	mustReviewScrapes(t, "node", nodeID.Config)
	mustBeMetricsReader(t, env.Config)

	// Everything else is refused.
	crd := &apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "localvolumes.localdir.csi.dev"}}
	for name, c := range map[string]client.Client{"node": node, "controller": ctrl} {
		mustForbid(t, c.Delete(ctx, crd.DeepCopy()), name+": delete the LocalVolume CRD")
		mustForbid(t, c.List(ctx, &corev1.SecretList{}), name+": list Secrets")
		mustForbid(t, c.List(ctx, &corev1.SecretList{}, client.InNamespace("localdir")), name+": list Secrets in its own namespace")
		mustForbid(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "localdir"}}), name+": create a ConfigMap")
	}
	// The controller never writes status (the node plugins own it) nor
	// LocalNodes.
	got := &v1.LocalVolume{}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(lv), got); err != nil {
		t.Fatal(err)
	}
	got.Status.Phase = v1.PhaseReady
	mustForbid(t, ctrl.Status().Update(ctx, got.DeepCopy()), "controller: update LocalVolume status")
	mustAllow(t, node.Status().Update(ctx, got.DeepCopy()), "node: update LocalVolume status")
	mustForbid(t, ctrl.Create(ctx, &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "node-ctrl"}}), "controller: create a LocalNode")

	// Nothing the refused calls aimed at changed.
	if err := admin.Get(ctx, client.ObjectKeyFromObject(crd), &apiextensionsv1.CustomResourceDefinition{}); err != nil {
		t.Errorf("the LocalVolume CRD: %v", err)
	}
	if err := admin.Get(ctx, client.ObjectKeyFromObject(lv), &v1.LocalVolume{}); err != nil {
		t.Errorf("the LocalVolume: %v", err)
	}
	// The node plugin deletes the object whose data it removed for a
	// DeleteVolume or DeleteSnapshot (the controller recorded
	// spec.deleteData).
	ls := &v1.LocalSnapshot{
		ObjectMeta: metav1.ObjectMeta{Name: "snap-00000000000000000000000000000001", Labels: map[string]string{v1.NodeLabel: "node-rbac"}},
		Spec:       v1.LocalSnapshotSpec{SourceVolume: lv.Name, Node: "node-rbac", CSIName: "rbac"},
	}
	mustAllow(t, ctrl.Create(ctx, ls), "controller: create a LocalSnapshot")
	for _, o := range []client.Object{ls, lv} {
		mustAllow(t, ctrl.Patch(ctx, o, mergePatch(`{"spec":{"deleteData":true}}`)), "controller: record a delete")
		mustAllow(t, node.Delete(ctx, o), fmt.Sprintf("node: delete a %T", o))
	}
}
