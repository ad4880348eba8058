//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// Scenarios of a production install: node plugins confined to their own
// node's objects by the API server, and a controller that survives the
// loss of its leader.

// nodePluginPod is the name and UID of the localdir node plugin pod on
// node.
func nodePluginPod(t *testing.T, node string) (string, types.UID) {
	t.Helper()
	pods, err := kc.CoreV1().Pods("localdir").List(context.Background(), metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=localdir,app.kubernetes.io/component=node", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("the node plugin pod on %s: %v (%d pods)", node, err, len(pods.Items))
	}
	return pods.Items[0].Name, pods.Items[0].UID
}

// clientWithToken is a dynamic client that authenticates with token only.
func clientWithToken(t *testing.T, token string) dynamic.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	anon := rest.AnonymousClientConfig(cfg)
	anon.BearerToken = token
	d, err := dynamic.NewForConfig(anon)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestNodePluginCannotTouchAnotherNodesVolumes: the credentials of node
// 2's node plugin (a token bound to its pod, as the kubelet mounts it)
// are refused by the API server when they patch node 1's LocalVolume,
// with a message naming both nodes, and when they set spec.deleteData on
// node 2's own; an annotation on node 2's own LocalVolume is allowed. The
// controller's writes and the node plugins' own work still pass: both
// PVCs bind, and their deletion removes the data and the objects.
func TestNodePluginCannotTouchAnotherNodesVolumes(t *testing.T) {
	needNodes(t, 2)
	ns := namespace(t, "nodescope")
	n1, n2 := cl.Nodes[0], cl.Nodes[1]
	createPVC(t, ns, "on1", pinnedClass(t, scImmediate, n1.Name), "16Mi")
	createPVC(t, ns, "on2", pinnedClass(t, scImmediate, n2.Name), "16Mi")
	waitBound(t, ns, "on1", 2*time.Minute)
	waitBound(t, ns, "on2", 2*time.Minute)
	_, id1 := volumeID(t, ns, "on1")
	_, id2 := volumeID(t, ns, "on2")

	pod, uid := nodePluginPod(t, n2.Name)
	token, err := cl.Kubectl(context.Background(), "", "create", "token", "localdir-node", "-n", "localdir",
		"--bound-object-kind", "Pod", "--bound-object-name", pod, "--bound-object-uid", string(uid), "--duration", "10m")
	if err != nil {
		t.Fatal(err)
	}
	node2 := clientWithToken(t, strings.TrimSpace(token)).Resource(gvrLocalVolume)
	ctx := context.Background()
	patch := func(id, p string) error {
		_, err := node2.Patch(ctx, id, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	for _, p := range []string{`{"spec":{"deleteData":true}}`, `{"metadata":{"annotations":{"e2e":"x"}}}`} {
		err := patch(id1, p)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "node plugin of node "+n2.Name) || !strings.Contains(err.Error(), "it belongs to node "+n1.Name) {
			t.Errorf("node 2's token patching node 1's LocalVolume with %s: %v, want Forbidden naming both nodes", p, err)
		} else {
			t.Logf("refused as it should be: %v", err)
		}
	}
	if err := patch(id2, `{"spec":{"deleteData":true}}`); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not change the spec") {
		t.Errorf("node 2's token setting deleteData on its own LocalVolume: %v, want Forbidden", err)
	}
	if err := patch(id2, `{"metadata":{"annotations":{"e2e":"x"}}}`); err != nil {
		t.Errorf("node 2's token annotating its own LocalVolume: %v, want it allowed", err)
	}
	if lv := localVolume(t, id1); lv == nil || lv.GetAnnotations()["e2e"] != "" {
		t.Errorf("node 1's LocalVolume changed: %v", lv)
	} else if del, _, _ := unstructured.NestedBool(lv.Object, "spec", "deleteData"); del {
		t.Errorf("node 1's LocalVolume got spec.deleteData")
	}

	// The controller's delete and each node plugin's own removal pass.
	for _, c := range []struct{ pvc, id string }{{"on1", id1}, {"on2", id2}} {
		if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, c.pvc, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "LocalVolume "+c.id+" gone after its PVC's deletion", 2*time.Minute, func() (bool, error) {
			return localVolume(t, c.id) == nil, nil
		})
		if left := onDisk(t, c.id); len(left) > 0 {
			t.Errorf("data of %s left on disk: %v", c.id, left)
		}
	}
}

// provisionerLeader is the pod holding csi-provisioner's Lease.
func provisionerLeader(t *testing.T) string {
	t.Helper()
	l, err := kc.CoordinationV1().Leases("localdir").Get(context.Background(), harness.ProvisionerLease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		t.Fatalf("csi-provisioner's Lease %s in namespace localdir: %v (held: %v)", harness.ProvisionerLease, err, err == nil && l.Spec.HolderIdentity != nil)
	}
	return *l.Spec.HolderIdentity
}

// waitControllerReplicas waits until the controller Deployment has n
// ready replicas and returns their pods' names.
func waitControllerReplicas(t *testing.T, n int) []string {
	t.Helper()
	var names []string
	waitFor(t, fmt.Sprintf("%d controller replicas ready", n), 3*time.Minute, func() (bool, error) {
		pods, err := kc.CoreV1().Pods("localdir").List(context.Background(), metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=localdir,app.kubernetes.io/component=controller"})
		if err != nil {
			return false, err
		}
		names = names[:0]
		for _, p := range pods.Items {
			ready := p.DeletionTimestamp == nil
			for _, c := range p.Status.ContainerStatuses {
				ready = ready && c.Ready
			}
			if ready && p.Status.Phase == corev1.PodRunning {
				names = append(names, p.Name)
			}
		}
		return len(names) == n && len(pods.Items) == n, nil
	})
	return names
}

// TestControllerLeaderKilledMidBurst: the controller runs two replicas;
// the pod whose csi-provisioner leads is killed (deleted with no grace
// period: its Lease is not released) while 20 PVCs are being provisioned.
// The other replica takes the Lease, every PVC binds, each to one PV and
// one LocalVolume (none made twice, none left over), and the Deployment is
// back at two replicas.
func TestControllerLeaderKilledMidBurst(t *testing.T) {
	needCluster(t)
	pods := waitControllerReplicas(t, 2)
	leader := provisionerLeader(t)
	t.Logf("controller pods %v, csi-provisioner leader %s", pods, leader)
	ns := namespace(t, "leaderkill")
	const n = 20
	ctx := context.Background()
	for i := range n {
		createPVC(t, ns, fmt.Sprintf("burst-%02d", i), scImmediate, "8Mi")
		if i == n/4 {
			zero := int64(0)
			if err := kc.CoreV1().Pods("localdir").Delete(ctx, leader, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed the leader %s after %d PVCs", leader, i+1)
		}
	}
	start := time.Now()
	var newLeader string
	waitFor(t, "another pod to take the csi-provisioner Lease", 2*time.Minute, func() (bool, error) {
		newLeader = provisionerLeader(t)
		return newLeader != leader, nil
	})
	t.Logf("new leader %s after %s", newLeader, time.Since(start).Round(time.Second))
	pvOf := map[string]string{} // PV name → PVC
	for i := range n {
		name := fmt.Sprintf("burst-%02d", i)
		p := waitBound(t, ns, name, 3*time.Minute)
		pvOf[p.Spec.VolumeName] = name
	}
	t.Logf("all %d PVCs bound %s after the kill", n, time.Since(start).Round(time.Second))
	if len(pvOf) != n {
		t.Errorf("%d PVCs bound to %d PVs", n, len(pvOf))
	}
	lvs, err := dyn.Resource(gvrLocalVolume).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perPV := map[string]int{}
	for _, lv := range lvs.Items {
		csiName, _, _ := unstructured.NestedString(lv.Object, "spec", "csiName")
		if _, ours := pvOf[csiName]; ours {
			perPV[csiName]++
		}
	}
	for pv, pvc := range pvOf {
		if perPV[pv] != 1 {
			t.Errorf("PVC %s (PV %s) has %d LocalVolumes, want 1", pvc, pv, perPV[pv])
		}
		pvObj, err := kc.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if lv := localVolume(t, pvObj.Spec.CSI.VolumeHandle); lv == nil {
			t.Errorf("PV %s: its volume %s has no LocalVolume", pv, pvObj.Spec.CSI.VolumeHandle)
		}
	}
	waitControllerReplicas(t, 2)
}
