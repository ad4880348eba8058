//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// slowClass is a copy of StorageClass base whose transfers run at 1 MiB/s
// (transferBandwidth), so that a test sees a move in progress.
func slowClass(t *testing.T, base string) string {
	t.Helper()
	ctx := context.Background()
	sc, err := kc.StorageV1().StorageClasses().Get(ctx, base, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{contract.ParamTransferBandwidth: "1Mi"}
	for k, v := range sc.Parameters {
		params[k] = v
	}
	slow := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: base + "-slow"},
		Provisioner: sc.Provisioner, Parameters: params, ReclaimPolicy: sc.ReclaimPolicy,
		AllowVolumeExpansion: sc.AllowVolumeExpansion, VolumeBindingMode: sc.VolumeBindingMode}
	if _, err := kc.StorageV1().StorageClasses().Create(ctx, slow, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return slow.Name
}

// The in-place move (the cluster's API server runs with the
// MutablePVNodeAffinity feature gate): a PVC whose pod wrote data on one
// node, its pod gone, is annotated localdir.csi.dev/move-to=<the other
// node>. A pod started for it once the move has begun waits (a
// WaitingForVolumeMove Event, not scheduled) and then runs on the other
// node with the data;
// the PV is the same and points there; the volume's data is on that
// node's disk only; the PVC's Events tell the story.
func TestMultiNodeVolumeMoveInPlace(t *testing.T) {
	needNodes(t, 2)
	ctx := context.Background()
	ns := namespace(t, "move")
	from, to := cl.Nodes[0], cl.Nodes[1]
	for _, class := range []string{scWFFC, scExt4} {
		t.Run(class, func(t *testing.T) {
			pvc := "data-" + class
			createPVC(t, ns, pvc, slowClass(t, class), "64Mi")
			createPod(t, ns, pvc+"-writer", pvcVolume(pvc, "/data"), onNode(from.Name))
			waitPodRunning(t, ns, pvc+"-writer", 2*time.Minute)
			sum := writeBlob(t, ns, pvc+"-writer", "/data/blob", "4Mi")
			deletePod(t, ns, pvc+"-writer")
			pvName, id := volumeID(t, ns, pvc)
			pvUID := mustGetPV(t, pvName).UID

			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, v1.MoveToAnnotation, to.Name)
			if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, pvc, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			// A pod started once the move has begun waits for it (one the
			// scheduler placed before would hold the move off until it
			// ends). No node selection: the PV decides where it runs.
			waitFor(t, "the PVC's VolumeMoveStarted Event", 2*time.Minute, func() (bool, error) {
				return slices.ContainsFunc(events(t, ns, "PersistentVolumeClaim", pvc), func(e string) bool { return strings.HasPrefix(e, "VolumeMoveStarted") }), nil
			})
			createPod(t, ns, pvc+"-reader", pvcVolume(pvc, "/data"))
			waitFor(t, "the reader's WaitingForVolumeMove Event", 2*time.Minute, func() (bool, error) {
				return slices.ContainsFunc(events(t, ns, "Pod", pvc+"-reader"), func(e string) bool { return strings.HasPrefix(e, "WaitingForVolumeMove") }), nil
			})
			waitPodRunning(t, ns, pvc+"-reader", 4*time.Minute)
			if on := podNode(t, ns, pvc+"-reader"); on != to {
				t.Fatalf("the reader runs on %s, want %s", on.Name, to.Name)
			}
			if got := md5In(t, ns, pvc+"-reader", "/data/blob"); got != sum {
				t.Fatalf("after the move the blob's md5 is %s, want %s", got, sum)
			}
			if on := pvNode(t, ns, pvc); on != to || mustGetPV(t, pvName).UID != pvUID {
				t.Fatalf("the PV points at %s (or was replaced), want the same PV on %s", on.Name, to.Name)
			}
			// The pod may run before the cut-over ends: the old node
			// removes its copy, then the LocalVolume is made on the new one.
			waitFor(t, "LocalVolume "+id+" on "+to.Name+" and the data on its disk only", 2*time.Minute, func() (bool, error) {
				u, err := dyn.Resource(gvrLocalVolume).Get(ctx, id, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return false, nil
				} else if err != nil {
					return false, retryTransient(t, err)
				}
				node, _, _ := unstructured.NestedString(u.Object, "spec", "node")
				return node == to.Name && len(onNodeDisk(t, from, id)) == 0, nil
			})
			mustBeOnlyOn(t, id, to)
			waitFor(t, "the PVC's VolumeMoved Event", time.Minute, func() (bool, error) {
				return slices.ContainsFunc(events(t, ns, "PersistentVolumeClaim", pvc), func(e string) bool { return strings.HasPrefix(e, "VolumeMoved") }), nil
			})
			said := events(t, ns, "PersistentVolumeClaim", pvc)
			for _, want := range []string{"VolumeMoveStarted", "TransferDone", "VolumeMoved"} {
				if !slices.ContainsFunc(said, func(e string) bool { return strings.HasPrefix(e, want) }) {
					t.Errorf("the PVC has no %s Event: %q", want, said)
				}
			}
			t.Logf("%s: moved %s → %s, md5 %s; PVC events %q", class, from.Name, to.Name, sum, said)
		})
	}
}

// The move without the feature gate, as docs/troubleshooting.md ("I must
// drain a node") gives it, with standard objects only: a VolumeSnapshot of
// the PVC; a new PVC restored from it for a pod on the other node, which
// holds the data; then the old PVC and the snapshot deleted, which removes
// the old node's data.
func TestMultiNodeMoveBySnapshotAndRestore(t *testing.T) {
	needNodes(t, 2)
	ns := namespace(t, "drain")
	from, to := cl.Nodes[0], cl.Nodes[1]
	createPVC(t, ns, "old", scWFFC, "64Mi")
	createPod(t, ns, "app", pvcVolume("old", "/data"), onNode(from.Name))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	sum := writeBlob(t, ns, "app", "/data/blob", "3Mi")
	_, oldID := volumeID(t, ns, "old")
	// 1. Stop the workload; 2. snapshot the PVC.
	deletePod(t, ns, "app")
	snapID := snapshotOf(t, ns, "before-drain", "old")
	// 3. A PVC from the snapshot, for the workload on the other node.
	createPVC(t, ns, "new", scWFFC, "64Mi", withSource("VolumeSnapshot", "before-drain"))
	createPod(t, ns, "app2", pvcVolume("new", "/data"), onNode(to.Name))
	waitPodRunning(t, ns, "app2", 3*time.Minute)
	if got := md5In(t, ns, "app2", "/data/blob"); got != sum {
		t.Fatalf("the restored blob's md5 is %s, want %s", got, sum)
	}
	if on := pvNode(t, ns, "new"); on != to {
		t.Fatalf("the new PVC's PV is on %s, want %s", on.Name, to.Name)
	}
	// 4. The old PVC and the snapshot go, and with them the old node's data.
	if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(context.Background(), "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(gvrSnapshot).Namespace(ns).Delete(context.Background(), "before-drain", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the old node's data gone", 2*time.Minute, func() (bool, error) {
		return len(onNodeDisk(t, from, oldID)) == 0 && len(onNodeDisk(t, from, snapID)) == 0, nil
	})
	_, newID := volumeID(t, ns, "new")
	mustBeOnlyOn(t, newID, to)
}

func mustGetPV(t *testing.T, name string) *corev1.PersistentVolume {
	t.Helper()
	pv, err := kc.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}
