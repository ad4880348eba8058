//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

var gvrSnapshotClass = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotclasses"}

// A snapshot of a VolumeSnapshotClass with copies "2" is kept on the other
// node too. Its own node is then lost (kubelet and node plugin stopped, the
// snapshot's data taken out of its data root): a PVC restored from the
// snapshot for a pod on the other node binds and holds the bytes, from the
// copy there. Deleting the VolumeSnapshot removes the copy.
func TestMultiNodeSnapshotCopySurvivesNodeLoss(t *testing.T) {
	needNodes(t, 2)
	ctx := context.Background()
	ns := namespace(t, "snap-copies")
	lost, keep := cl.Nodes[1], cl.Nodes[0]
	class := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata": map[string]any{"name": "e2e-copies"}, "driver": driver.DefaultDriverName,
		"deletionPolicy": "Delete", "parameters": map[string]any{"copies": "2"},
	}}
	if _, err := dyn.Resource(gvrSnapshotClass).Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(gvrSnapshotClass).Delete(context.Background(), "e2e-copies", metav1.DeleteOptions{})
	})

	createPVC(t, ns, "src", pinnedClass(t, scImmediate, lost.Name), "16Mi")
	createPod(t, ns, "writer", pvcVolume("src", "/data"))
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	sum := writeBlob(t, ns, "writer", "/data/blob", "3Mi")
	id := snapshotIn(t, ns, "snap", "src", "e2e-copies")
	copyName := contract.SnapshotCopyName(id, keep.Name)
	waitFor(t, "the snapshot's copy on "+keep.Name+" ready", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Resource(gvrLocalSnapshot).Get(ctx, copyName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, retryTransient(t, err)
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		return ready, nil
	})
	if got := onNodeDisk(t, keep, id); len(got) != 1 {
		t.Fatalf("the copy's data on %s: %v, want snapshots/%s", keep.Name, got, id)
	}

	// The snapshot's node is lost: no kubelet, no node plugin, and its
	// snapshot data out of the data root (put back afterwards, so the node
	// serves later tests).
	back := false
	snapDir := filepath.Join(lost.Path(harness.DataRoot), "snapshots", id)
	aside := filepath.Join(lost.Path(harness.DataRoot), ".aside-"+id) // same filesystem; back before the plugin starts
	restoreNode := func() {
		if back {
			return
		}
		back = true
		if err := os.Rename(aside, snapDir); err != nil && !os.IsNotExist(err) {
			t.Error(err)
		}
		if err := lost.StartKubelet(context.Background()); err != nil {
			t.Error(err)
		}
	}
	defer restoreNode()
	if err := lost.StopKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(snapDir, aside); err != nil {
		t.Fatal(err)
	}

	createPVC(t, ns, "restored", scWFFC, "16Mi", withSource("VolumeSnapshot", "snap"))
	createPod(t, ns, "reader", pvcVolume("restored", "/data"), onNode(keep.Name))
	waitPodRunning(t, ns, "reader", 3*time.Minute)
	if got := md5In(t, ns, "reader", "/data/blob"); got != sum {
		t.Fatalf("restored from the copy: md5 %s, want %s", got, sum)
	}
	_, vid := volumeID(t, ns, "restored")
	mustBeOnlyOn(t, vid, keep)
	if from, _, _ := unstructured.NestedString(localVolume(t, vid).Object, "spec", "contentSource", "node"); from != "" {
		t.Errorf("the restore was pulled from %s, want a local restore from the copy on %s", from, keep.Name)
	}
	restoreNode()

	if err := dyn.Resource(gvrSnapshot).Namespace(ns).Delete(ctx, "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the copy gone with the VolumeSnapshot", 2*time.Minute, func() (bool, error) {
		_, err := dyn.Resource(gvrLocalSnapshot).Get(ctx, copyName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(onNodeDisk(t, keep, id)) == 0, nil
	})
	waitFor(t, "the snapshot's data gone from "+lost.Name, 2*time.Minute, func() (bool, error) {
		return len(onNodeDisk(t, lost, id)) == 0, nil
	})
	t.Logf("snapshot %s: copy on %s, restored there with %s lost (md5 %s), both gone with the VolumeSnapshot", id, keep.Name, lost.Name, sum)
}
