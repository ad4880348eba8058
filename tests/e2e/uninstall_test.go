//go:build e2e

package e2e

// Issue 8: users' data is destroyed only by a DeleteVolume or
// DeleteSnapshot for it — not by uninstalling (CRDs included), a
// LocalVolume deleted by hand, or a cleared finalizer. These run last
// (file order): the first one uninstalls and reinstalls localdir.

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

var (
	gvrLocalSnapshot   = schema.GroupVersionResource{Group: "localdir.csi.dev", Version: "v1alpha1", Resource: "localsnapshots"}
	gvrSnapshotContent = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// snapshotOf creates a VolumeSnapshot of pvc, waits until it is ready and
// returns the snapshot id (its content's snapshotHandle).
func snapshotOf(t *testing.T, ns, name, pvc string) string {
	t.Helper()
	return snapshotIn(t, ns, name, pvc, "localdir")
}

// snapshotIn is snapshotOf with the VolumeSnapshotClass class.
func snapshotIn(t *testing.T, ns, name, pvc, class string) string {
	t.Helper()
	ctx := context.Background()
	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{"volumeSnapshotClassName": class,
			"source": map[string]any{"persistentVolumeClaimName": pvc}},
	}}
	if _, err := dyn.Resource(gvrSnapshot).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var content string
	waitFor(t, "VolumeSnapshot "+name+" readyToUse", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Resource(gvrSnapshot).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, retryTransient(t, err)
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		content, _, _ = unstructured.NestedString(u.Object, "status", "boundVolumeSnapshotContentName")
		return ready && content != "", nil
	})
	u, err := dyn.Resource(gvrSnapshotContent).Get(ctx, content, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := unstructured.NestedString(u.Object, "status", "snapshotHandle")
	if id == "" {
		t.Fatalf("VolumeSnapshotContent %s has no snapshotHandle", content)
	}
	return id
}

// waitReadopted waits until the object id of gvr exists again, re-created
// by the node plugin (readopted label), and Ready.
func waitReadopted(t *testing.T, gvr schema.GroupVersionResource, id string) {
	t.Helper()
	waitFor(t, gvr.Resource+" "+id+" re-adopted", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Resource(gvr).Get(context.Background(), id, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil // not re-created yet
		}
		if err != nil {
			return false, retryTransient(t, err)
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return u.GetLabels()[v1.ReadoptedLabel] == "true" && u.GetDeletionTimestamp() == nil && phase == v1.PhaseReady, nil
	})
}

func mustBeOnDisk(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if len(onDisk(t, id)) == 0 {
			t.Fatalf("the data of %s is gone from the data root", id)
		}
	}
}

// `kubectl delete -k deploy/kubernetes` (CRDs included) while pods use
// volumes and a snapshot exists; then install again: every PV mounts again
// with its data, the snapshot restores, nothing was deleted meanwhile —
// and deleting the PVCs afterwards still removes their data.
func TestUninstallAndReinstallKeepData(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "uninstall")
	createPVC(t, ns, "fs", scWFFC, "32Mi")
	createPVC(t, ns, "raw", scWFFC, "16Mi", block)
	createPod(t, ns, "app", pvcVolume("fs", "/data"), pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	sum := writeBlob(t, ns, "app", "/data/blob", "2Mi")
	podExec(t, ns, "app", "echo raw-before-uninstall | dd of=/dev/xvda conv=fsync 2>/dev/null")
	sid := snapshotOf(t, ns, "snap", "fs")
	_, fsID := volumeID(t, ns, "fs")
	_, rawID := volumeID(t, ns, "raw")
	mustBeOnDisk(t, fsID, rawID, sid)

	t0 := time.Now()
	if err := cl.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl delete -k deploy/kubernetes finished in %.1fs", time.Since(t0).Seconds())
	if out, err := cl.Kubectl(ctx, "", "get", "crd", "-o", "name"); err != nil || strings.Contains(out, "localdir.csi.dev") {
		t.Fatalf("localdir CRDs after the uninstall: %q %v", out, err)
	}
	// Nothing was deleted: the data, and the running pod's view of it.
	mustBeOnDisk(t, fsID, rawID, sid)
	if got := md5In(t, ns, "app", "/data/blob"); got != sum {
		t.Fatalf("after the uninstall the pod reads md5 %s, want %s", got, sum)
	}

	t0 = time.Now()
	if err := cl.Reinstall(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("installed again in %.1fs", time.Since(t0).Seconds())
	for _, id := range []string{fsID, rawID} {
		waitReadopted(t, gvrLocalVolume, id)
	}
	waitReadopted(t, gvrLocalSnapshot, sid)

	// The PVs mount again (attach, stage, publish) with their data.
	deletePod(t, ns, "app")
	createPod(t, ns, "app2", pvcVolume("fs", "/data"), pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "app2", 2*time.Minute)
	if got := md5In(t, ns, "app2", "/data/blob"); got != sum {
		t.Fatalf("after reinstalling the PV holds md5 %s, want %s", got, sum)
	}
	if got := podExec(t, ns, "app2", "head -c 20 /dev/xvda"); got != "raw-before-uninstall" {
		t.Fatalf("the block PV holds %q after reinstalling", got)
	}
	// The snapshot restores (on its node: the reader runs there).
	createPVC(t, ns, "restored", scWFFC, "32Mi", withSource("VolumeSnapshot", "snap"))
	createPod(t, ns, "reader", pvcVolume("restored", "/restored"), onNode(pvNode(t, ns, "fs").Name))
	waitPodRunning(t, ns, "reader", 2*time.Minute)
	if got := md5In(t, ns, "reader", "/restored/blob"); got != sum {
		t.Fatalf("restored from the snapshot after reinstalling: md5 %s, want %s", got, sum)
	}
	// While no CSIDriver object existed the attach/detach controller took
	// the PVs the running pod uses for attachable and may have made
	// VolumeAttachments for them, which csi-provisioner then waits on before
	// deleting (minutes, until that controller detaches): docs/uninstall.md
	// tells users to delete them, as here.
	removeStaleAttachments(t, "fs", "raw")
	// A real delete still removes data: the PVCs and the snapshot go.
	if err := dyn.Resource(gvrSnapshot).Namespace(ns).Delete(ctx, "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot's data to be deleted", 2*time.Minute, func() (bool, error) { return len(onDisk(t, sid)) == 0, nil })
	deletePod(t, ns, "app2")
	for _, pvc := range []string{"fs", "raw"} {
		if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, pvc, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the data of the deleted PVCs to be deleted", 2*time.Minute, func() (bool, error) {
		return len(onDisk(t, fsID))+len(onDisk(t, rawID)) == 0, nil
	})
	t.Logf("uninstalled with 2 PVs in use and a snapshot, installed again: objects re-adopted, PVs mounted with their data, snapshot restored; deletes afterwards removed the data")
}

// removeStaleAttachments deletes the VolumeAttachments of the given PVCs'
// volumes (docs/uninstall.md, reinstalling while pods use volumes) and
// waits until they are gone.
func removeStaleAttachments(t *testing.T, pvcs ...string) {
	t.Helper()
	ctx := context.Background()
	pvs := map[string]bool{}
	vas, err := kc.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		pv := va.Spec.Source.PersistentVolumeName
		if pv == nil || va.Spec.Attacher != harness.DriverName {
			continue
		}
		p, err := kc.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{})
		if err != nil || p.Spec.ClaimRef == nil || !slices.Contains(pvcs, p.Spec.ClaimRef.Name) {
			continue
		}
		t.Logf("VolumeAttachment %s of PV %s (claim %s), made while no CSIDriver object existed: deleted, as docs/uninstall.md says", va.Name, *pv, p.Spec.ClaimRef.Name)
		if err := kc.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		pvs[va.Name] = true
	}
	waitFor(t, "the stale VolumeAttachments to be gone", 2*time.Minute, func() (bool, error) {
		for name := range pvs {
			if _, err := kc.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}

// A LocalVolume deleted by hand: the data stays, the node plugin
// re-creates the object, and the PV mounts again with its data.
func TestLocalVolumeDeletedByHand(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "byhand")
	createPVC(t, ns, "a", scWFFC, "16Mi")
	createPod(t, ns, "app", pvcVolume("a", "/data"))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	sum := writeBlob(t, ns, "app", "/data/blob", "1Mi")
	_, id := volumeID(t, ns, "a")
	uid := localVolume(t, id).GetUID()
	if out, err := cl.Kubectl(ctx, "", "delete", "localvolume", id, "--wait=true", "--timeout=60s"); err != nil {
		t.Fatalf("kubectl delete localvolume: %v: %s", err, out)
	}
	mustBeOnDisk(t, id)
	waitReadopted(t, gvrLocalVolume, id)
	if localVolume(t, id).GetUID() == uid {
		t.Fatal("the LocalVolume was never deleted")
	}
	deletePod(t, ns, "app")
	createPod(t, ns, "app2", pvcVolume("a", "/data"))
	waitPodRunning(t, ns, "app2", 2*time.Minute)
	if got := md5In(t, ns, "app2", "/data/blob"); got != sum {
		t.Fatalf("after the LocalVolume was deleted by hand the PV holds md5 %s, want %s", got, sum)
	}
	t.Logf("LocalVolume %s deleted by hand: data kept, object re-adopted, PV mounted again with its data", id)
}

// A DeleteVolume while the node plugin is down leaves the LocalVolume
// alive with the delete intent (spec.deleteData), and no finalizer.
// Deleting it by hand with the documented command deletes nothing; when
// the node plugin returns it re-adopts the data, and the documented
// removal (recording the intent) deletes the data and the object.
func TestPendingDeleteDeletedByHandKeepsData(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "finalizer")
	createPVC(t, ns, "a", scImmediate, "16Mi")
	createPod(t, ns, "app", pvcVolume("a", "/data"))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	podExec(t, ns, "app", "echo precious > /data/f && sync")
	deletePod(t, ns, "app")
	pv, id := volumeID(t, ns, "a")
	// Unstaged and detached first: the node plugin goes down next.
	waitFor(t, "PV "+pv+" detached", 2*time.Minute, func() (bool, error) {
		vas, err := kc.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, retryTransient(t, err)
		}
		for _, va := range vas.Items {
			if n := va.Spec.Source.PersistentVolumeName; n != nil && *n == pv {
				return false, nil
			}
		}
		return true, nil
	})

	// The node plugin goes down with its node's kubelet (the kubelet
	// would restart a node plugin that merely crashed).
	on := pvNode(t, ns, "a")
	restarted := false
	defer func() {
		if !restarted {
			_ = on.StartKubelet(ctx)
		}
	}()
	if err := on.StopKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "PV "+pv+" deleted and LocalVolume "+id+" waiting with spec.deleteData", 2*time.Minute, func() (bool, error) {
		_, err := kc.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		lv := localVolume(t, id)
		if lv == nil {
			return false, nil
		}
		intent, _, _ := unstructured.NestedBool(lv.Object, "spec", "deleteData")
		return apierrors.IsNotFound(err) && intent && lv.GetDeletionTimestamp() == nil && len(lv.GetFinalizers()) == 0, nil
	})
	mustBeOnDisk(t, id)
	// docs/uninstall.md: a delete that never finishes.
	if out, err := cl.Kubectl(ctx, "", "delete", "localvolume", id, "--wait=true", "--timeout=30s"); err != nil {
		t.Fatalf("kubectl delete localvolume: %v: %s", err, out)
	}
	mustBeOnDisk(t, id)

	if err := on.StartKubelet(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	waitReadopted(t, gvrLocalVolume, id)
	mustBeOnDisk(t, id)
	// docs/uninstall.md: removing an orphan for good.
	if out, err := cl.Kubectl(ctx, "", "patch", "localvolume", id, "--type", "merge",
		"-p", `{"spec":{"deleteData":true}}`); err != nil {
		t.Fatalf("record the delete intent: %v: %s", err, out)
	}
	waitFor(t, "LocalVolume "+id+" and its data gone", time.Minute, func() (bool, error) {
		return localVolume(t, id) == nil && len(onDisk(t, id)) == 0, nil
	})
	t.Logf("pending delete deleted by hand with the node plugin down: data kept; re-adopted when it returned; removed for good with the documented command")
}
