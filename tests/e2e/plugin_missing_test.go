//go:build e2e

package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// The CSIDriver's preventPodSchedulingIfMissing: with the node plugin kept
// off a node by the DaemonSet's node affinity, a pod using a localdir PVC
// is never scheduled there: a new one lands on the node that has the
// plugin; one whose volume lives there (the PV's node affinity names that
// node) stays Pending with the scheduler's reason, not ContainerCreating
// on a node that cannot mount it.
func TestNoPodWhereThePluginIsMissing(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	if len(cl.Nodes) < 2 {
		t.Fatalf("needs two nodes, the cluster has %d", len(cl.Nodes))
	}
	off := cl.Nodes[len(cl.Nodes)-1].Name
	dsClient := kc.AppsV1().DaemonSets("localdir")
	registered := func() (bool, error) {
		n, err := kc.StorageV1().CSINodes().Get(ctx, off, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(n.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == "localdir.csi.dev" }), nil
	}
	d, err := kc.StorageV1().CSIDrivers().Get(ctx, "localdir.csi.dev", metav1.GetOptions{})
	if err != nil || d.Spec.PreventPodSchedulingIfMissing == nil || !*d.Spec.PreventPodSchedulingIfMissing {
		t.Fatalf("CSIDriver localdir.csi.dev: preventPodSchedulingIfMissing not set (%v)", err)
	}
	// A volume made on that node while its plugin ran: the PV's node
	// affinity alone would let a pod be scheduled there.
	ns := namespace(t, "plugin-missing")
	createPVC(t, ns, "there", scWFFC, "16Mi")
	createPod(t, ns, "writer", pvcVolume("there", "/data"), onNode(off))
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	deletePod(t, ns, "writer")

	// The node is excluded in the DaemonSet, not by changing a node label
	// (the kubelet puts kubernetes.io/os back within seconds). OnDelete
	// keeps the other nodes' plugins running through the template change;
	// the DaemonSet controller still removes the pod of the excluded node.
	orig, err := dsClient.Get(ctx, "localdir-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exclude := orig.DeepCopy()
	exclude.Spec.UpdateStrategy = appsv1.DaemonSetUpdateStrategy{Type: appsv1.OnDeleteDaemonSetStrategyType}
	exclude.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{off}}},
		}}},
	}}
	if _, err := dsClient.Update(ctx, exclude, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := dsClient.Get(ctx, "localdir-node", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.Template = orig.Spec.Template
			cur.Spec.UpdateStrategy = orig.Spec.UpdateStrategy
			_, err = dsClient.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("restoring DaemonSet localdir-node: %v", err)
		}
		waitFor(t, "the node plugin on "+off+" registered again", 3*time.Minute, registered)
		waitFor(t, "every node plugin up to date and Ready", 3*time.Minute, func() (bool, error) {
			ds, err := dsClient.Get(ctx, "localdir-node", metav1.GetOptions{})
			return err == nil && ds.Status.ObservedGeneration >= ds.Generation &&
				int(ds.Status.UpdatedNumberScheduled) == len(cl.Nodes) &&
				int(ds.Status.NumberReady) == len(cl.Nodes), err
		})
	})
	waitFor(t, "the node plugin on "+off+" gone from its CSINode", 2*time.Minute, func() (bool, error) {
		ok, err := registered()
		return !ok, err
	})

	createPVC(t, ns, "anywhere", scWFFC, "16Mi")
	createPod(t, ns, "anywhere", pvcVolume("anywhere", "/data"))
	waitPodRunning(t, ns, "anywhere", 2*time.Minute)
	if n := podNode(t, ns, "anywhere").Name; n == off {
		t.Errorf("pod anywhere was scheduled onto %s, which has no node plugin", off)
	}

	createPod(t, ns, "there", pvcVolume("there", "/data"))
	var why string
	waitFor(t, "pod there refused by the scheduler", time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "Pod", "there") {
			if strings.HasPrefix(e, "FailedScheduling") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	time.Sleep(10 * time.Second)
	p, err := kc.CoreV1().Pods(ns).Get(ctx, "there", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Errorf("pod there: node %q, phase %s; want Pending and unscheduled", p.Spec.NodeName, p.Status.Phase)
	}
	t.Logf("a pod whose volume is on %s, without the node plugin there: %s", off, why)
}
