//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// writeBlob writes size bytes of random data to path in the pod and
// returns their md5 sum.
func writeBlob(t *testing.T, ns, pod, path, size string) string {
	t.Helper()
	out := podExec(t, ns, pod, fmt.Sprintf("head -c %d /dev/urandom > %s && sync && md5sum %s", mustQuantity(size), path, path))
	return strings.Fields(out)[0]
}

func md5In(t *testing.T, ns, pod, path string) string {
	t.Helper()
	return strings.Fields(podExec(t, ns, pod, "md5sum "+path))[0]
}

// 1. Immediate and WaitForFirstConsumer StorageClasses: PVC Bound, a pod
// writes, is deleted, a new pod reads the same bytes.
func TestBindingModesAndPersistence(t *testing.T) {
	needCluster(t)
	for _, tc := range []struct{ class string }{{scImmediate}, {scWFFC}} {
		t.Run(tc.class, func(t *testing.T) {
			ns := namespace(t, "bind-"+tc.class)
			createPVC(t, ns, "data", tc.class, "64Mi")
			if tc.class == scImmediate {
				waitBound(t, ns, "data", time.Minute)
			} else {
				// Pending, and saying why, until a pod uses it.
				waitFor(t, "the WaitForFirstConsumer event", time.Minute, func() (bool, error) {
					return strings.Contains(strings.Join(events(t, ns, "PersistentVolumeClaim", "data"), "\n"), "WaitForFirstConsumer"), nil
				})
				if p := getPVC(t, ns, "data"); p.Status.Phase != corev1.ClaimPending {
					t.Fatalf("WaitForFirstConsumer PVC is %s before any pod, want Pending", p.Status.Phase)
				}
			}
			createPod(t, ns, "writer", pvcVolume("data", "/data"))
			waitPodRunning(t, ns, "writer", 2*time.Minute)
			pvc := waitBound(t, ns, "data", time.Minute)
			sum := writeBlob(t, ns, "writer", "/data/blob", "1Mi")

			// The PV is pinned by localdir's topology key to the node the
			// pod runs on, and the volume's data is there and nowhere else.
			on := pvNode(t, ns, "data")
			if ran := podNode(t, ns, "writer"); ran.Name != on.Name {
				t.Fatalf("PV pinned to %s, its pod runs on %s", on.Name, ran.Name)
			}
			_, id := volumeID(t, ns, "data")
			for _, n := range cl.Nodes {
				if got := len(onNodeDisk(t, n, id)) > 0; got != (n == on) {
					t.Fatalf("volume %s on the disk of node %s: %v, want %v (it is %s's)", id, n.Name, got, n == on, on.Name)
				}
			}

			deletePod(t, ns, "writer")
			createPod(t, ns, "reader", pvcVolume("data", "/data"))
			waitPodRunning(t, ns, "reader", 2*time.Minute)
			if got := md5In(t, ns, "reader", "/data/blob"); got != sum {
				t.Fatalf("new pod reads md5 %s, the first pod wrote %s", got, sum)
			}
			t.Logf("%s: PVC Bound to %s on %s; 1Mi written by one pod, the same bytes read by the next (md5 %s)", tc.class, pvc.Spec.VolumeName, on.Name, sum)
		})
	}
}

// 2. VolumeSnapshot readyToUse with restoreSize; a PVC from the snapshot
// and a clone of the PVC, both larger than the source, hold its data. On
// the first node (btrfs enforces the sizes); the reader is pinned there
// too, since a WaitForFirstConsumer restore or clone must be made on its
// source's node and the scheduler does not know that.
func TestSnapshotRestoreClone(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "snapshot")
	createPVC(t, ns, "src", scWFFC, "64Mi")
	createPod(t, ns, "writer", pvcVolume("src", "/data"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	sum := writeBlob(t, ns, "writer", "/data/blob", "2Mi")

	snap := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap"},
		"spec": map[string]any{"volumeSnapshotClassName": "localdir",
			"source": map[string]any{"persistentVolumeClaimName": "src"}},
	}}
	if _, err := dyn.Resource(gvrSnapshot).Namespace(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var restoreSize string
	waitFor(t, "VolumeSnapshot readyToUse", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Resource(gvrSnapshot).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, retryTransient(t, err)
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		restoreSize, _, _ = unstructured.NestedString(u.Object, "status", "restoreSize")
		if msg, ok, _ := unstructured.NestedString(u.Object, "status", "error", "message"); ok && !ready {
			return false, retryTransientMessage(t, "VolumeSnapshot status.error", msg)
		}
		return ready, nil
	})
	if q := resource.MustParse(restoreSize); q.Value() != mustQuantity("64Mi") {
		t.Fatalf("restoreSize = %s, want 64Mi", restoreSize)
	}

	createPVC(t, ns, "restored", scWFFC, "128Mi", withSource("VolumeSnapshot", "snap"))
	createPVC(t, ns, "clone", scWFFC, "128Mi", withSource("PersistentVolumeClaim", "src"))
	createPod(t, ns, "reader", pvcVolume("restored", "/restored"), pvcVolume("clone", "/clone"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "reader", 2*time.Minute)
	for _, name := range []string{"restored", "clone"} {
		p := waitBound(t, ns, name, time.Minute)
		if c := p.Status.Capacity[corev1.ResourceStorage]; c.Value() != mustQuantity("128Mi") {
			t.Fatalf("PVC %s capacity %s, want 128Mi", name, c.String())
		}
		if got := md5In(t, ns, "reader", "/"+name+"/blob"); got != sum {
			t.Fatalf("%s holds md5 %s, the source %s", name, got, sum)
		}
		// Larger than the source for real: 96Mi more fits in 128Mi, and
		// would not have in the 64Mi source (btrfs enforces the size).
		podExec(t, ns, "reader", fmt.Sprintf("dd if=/dev/urandom of=/%s/more bs=1M count=96 conv=fsync 2>&1", name))
	}
	// The source is unchanged by writes to the restored volume and clone.
	if got := md5In(t, ns, "writer", "/data/blob"); got != sum {
		t.Fatalf("source changed: md5 %s, want %s", got, sum)
	}
	if _, err := tryExec(ns, "writer", "test ! -e /data/more"); err != nil {
		t.Fatal("a write to the restored volume or clone showed up in the source")
	}
	t.Logf("snapshot ready (restoreSize %s); restored PVC and clone at 128Mi hold the source's bytes (md5 %s) and take 96Mi more", restoreSize, sum)
}

// 3. Online resize of a bound, mounted PVC: the pod sees the new size, a
// write past the old size succeeds and one past the new size fails
// (btrfs data root: the size is a qgroup limit; the pod runs on the first
// node, whose data root is btrfs). A raw block PVC grows under its
// running pod too.
func TestOnlineResize(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "resize")
	createPVC(t, ns, "data", scWFFC, "64Mi")
	createPVC(t, ns, "raw", scWFFC, "32Mi", block)
	createPod(t, ns, "app", pvcVolume("data", "/data"), pvcVolume("raw", "/dev/xvda"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	waitBound(t, ns, "data", time.Minute)
	_, id := volumeID(t, ns, "data")

	// Before: 80Mi does not fit in 64Mi.
	if out := podExec(t, ns, "app", "dd if=/dev/urandom of=/data/big bs=1M count=80 conv=fsync 2>&1 || echo FAILED"); !strings.Contains(out, "FAILED") || !strings.Contains(out, "quota") {
		t.Fatalf("writing 80Mi into a 64Mi volume: want a quota error, got %q", out)
	} else {
		t.Logf("before: 80Mi into 64Mi fails as it should: %s", strings.Split(out, "\n")[0])
	}
	podExec(t, ns, "app", "rm -f /data/big && sync")
	dfBefore := podExec(t, ns, "app", "df -k /data | tail -1")
	rawBefore := podExec(t, ns, "app", "blockdev --getsize64 /dev/xvda")
	if rawBefore != strconv.FormatInt(mustQuantity("32Mi"), 10) {
		t.Fatalf("block device size %s, want 32Mi", rawBefore)
	}

	for _, c := range []struct{ pvc, size string }{{"data", "160Mi"}, {"raw", "64Mi"}} {
		patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, c.size)
		if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, c.pvc, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ pvc, size string }{{"data", "160Mi"}, {"raw", "64Mi"}} {
		waitFor(t, "PVC "+c.pvc+" resized to "+c.size, 2*time.Minute, func() (bool, error) {
			p := getPVC(t, ns, c.pvc)
			q := p.Status.Capacity[corev1.ResourceStorage]
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PersistentVolumeClaimResizing || cond.Type == corev1.PersistentVolumeClaimFileSystemResizePending {
					return false, nil
				}
			}
			return q.Value() == mustQuantity(c.size), nil
		})
	}
	lv := localVolume(t, id)
	// spec.size is a quantity ("160Mi").
	if size, _, _ := unstructured.NestedFieldNoCopy(lv.Object, "spec", "size"); mustQuantity(fmt.Sprint(size)) != mustQuantity("160Mi") {
		t.Fatalf("LocalVolume %s size %v, want 160Mi", id, size)
	}
	// The pod sees the new sizes: the block device at once, the
	// filesystem through its quota.
	waitFor(t, "the pod to see the block device at 64Mi", time.Minute, func() (bool, error) {
		out, err := tryExec(ns, "app", "blockdev --getsize64 /dev/xvda")
		return err == nil && out == strconv.FormatInt(mustQuantity("64Mi"), 10), nil
	})
	podExec(t, ns, "app", "dd if=/dev/urandom of=/data/big bs=1M count=112 conv=fsync 2>&1")
	out, err := tryExec(ns, "app", "dd if=/dev/urandom of=/data/more bs=1M count=64 conv=fsync 2>&1 || echo FAILED")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "FAILED") || !strings.Contains(out, "quota") {
		t.Fatalf("writing 176Mi into a 160Mi volume: want a quota error, got %q", out)
	}
	err = fmt.Errorf("%s", strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(out), "FAILED")))
	dfAfter := podExec(t, ns, "app", "df -k /data | tail -1")
	t.Logf("resize 64Mi→160Mi online: 112Mi now fits, 176Mi fails (%s); block 32Mi→64Mi seen by the pod", lastLine(err.Error()))
	t.Logf("df in the pod before: %s", dfBefore)
	t.Logf("df in the pod after:  %s (df shows the data root's filesystem; the volume's size is its btrfs quota)", dfAfter)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}

// 4. A raw block PVC used by a pod as a device, its data kept across pods.
func TestRawBlock(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "block")
	createPVC(t, ns, "raw", scImmediate, "32Mi", block)
	waitBound(t, ns, "raw", time.Minute)
	createPod(t, ns, "user", pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "user", 2*time.Minute)
	podExec(t, ns, "user", "test -b /dev/xvda")
	if got := podExec(t, ns, "user", "blockdev --getsize64 /dev/xvda"); got != strconv.FormatInt(mustQuantity("32Mi"), 10) {
		t.Fatalf("device size %s, want 32Mi", got)
	}
	sum := strings.Fields(podExec(t, ns, "user", "head -c 1048576 /dev/urandom > /tmp/b && dd if=/tmp/b of=/dev/xvda bs=1M seek=7 conv=fsync 2>/dev/null && md5sum /tmp/b"))[0]
	deletePod(t, ns, "user")
	createPod(t, ns, "user2", pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "user2", 2*time.Minute)
	got := strings.Fields(podExec(t, ns, "user2", "dd if=/dev/xvda bs=1M skip=7 count=1 2>/dev/null | md5sum"))[0]
	if got != sum {
		t.Fatalf("block device holds md5 %s at 7Mi, the first pod wrote %s", got, sum)
	}
	t.Logf("raw block PVC: a 32Mi device; 1Mi written at offset 7Mi by one pod read back by the next (md5 %s)", sum)
}

// 5. A CSI ephemeral inline volume: there while the pod runs, gone after.
func TestEphemeralInline(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "inline")
	before := onDisk(t, "")
	pod := createPod(t, ns, "scratch", inlineVolume("/scratch", map[string]string{"size": "32Mi"}))
	waitPodRunning(t, ns, "scratch", 2*time.Minute)
	podExec(t, ns, "scratch", "echo hello > /scratch/f && grep -q hello /scratch/f")
	// The volume's directory on the node: named after the pod's volume handle.
	uid := string(pod.UID)
	if out := podExec(t, ns, "scratch", "grep ' /scratch ' /proc/mounts"); out == "" {
		t.Fatal("/scratch is not a mount in the pod")
	}
	during := onDisk(t, "")
	added := diff(during, before)
	if len(added) == 0 {
		t.Fatalf("no new entry under the data root while the inline volume is in use")
	}
	deletePod(t, ns, "scratch")
	waitFor(t, "the inline volume's data to be deleted", time.Minute, func() (bool, error) {
		return len(diff(onDisk(t, ""), before)) == 0, nil
	})
	t.Logf("inline volume of pod %s: %d new paths under the data root while it ran (%s), none after", uid, len(added), strings.Join(added, " "))
}

func diff(a, b []string) []string {
	seen := map[string]bool{}
	for _, x := range b {
		seen[x] = true
	}
	var out []string
	for _, x := range a {
		if !seen[x] {
			out = append(out, x)
		}
	}
	return out
}

// 6. A non-root pod with fsGroup writes to its volume (fsGroupPolicy File,
// case C33), even when the StorageClass makes the volume's root 0750.
func TestFSGroupNonRoot(t *testing.T) {
	needCluster(t)
	d, err := kc.StorageV1().CSIDrivers().Get(context.Background(), harness.DriverName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.FSGroupPolicy == nil || *d.Spec.FSGroupPolicy != "File" {
		t.Fatalf("CSIDriver fsGroupPolicy = %v, want File", d.Spec.FSGroupPolicy)
	}
	ns := namespace(t, "fsgroup")
	id := int64(65534)
	createPVC(t, ns, "data", sc0750, "16Mi")
	createPod(t, ns, "nonroot", pvcVolume("data", "/data"),
		securityContext(&corev1.PodSecurityContext{RunAsUser: &id, RunAsGroup: &id, FSGroup: &id}))
	waitPodRunning(t, ns, "nonroot", 2*time.Minute)
	podExec(t, ns, "nonroot", "touch /data/f && echo ok > /data/f")
	ids := podExec(t, ns, "nonroot", "id -u; id -G")
	ls := podExec(t, ns, "nonroot", "ls -ldn /data")
	f := strings.Fields(ls)
	if len(f) < 4 || f[3] != "65534" || f[0][6] != 's' {
		t.Fatalf("/data is %q: want group 65534 with the setgid bit", ls)
	}
	t.Logf("uid/gids %s; %s", strings.ReplaceAll(ids, "\n", " / "), ls)
}

// capacityOf returns the CSIStorageCapacity of class for a node.
func capacityOf(t testing.TB, class, nodeName string) int64 {
	t.Helper()
	l, err := kc.StorageV1().CSIStorageCapacities("localdir").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range l.Items {
		if c.StorageClassName != class || c.NodeTopology == nil || c.NodeTopology.MatchLabels[topologyKey] != nodeName {
			continue
		}
		if c.Capacity == nil {
			return 0
		}
		return c.Capacity.Value()
	}
	t.Fatalf("no CSIStorageCapacity for class %s and node %s", class, nodeName)
	return 0
}

// 7. Capacity: CSIStorageCapacity objects exist for the node and follow
// the volumes; a PVC larger than what is left stays Pending with an event
// that says why, and binds once room is made. On the first node, with
// classes pinned to it (allowedTopologies) when there are several.
func TestCapacity(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "capacity")
	nodeName := harness.NodeName
	immediate, wffc := pinnedClass(t, scImmediate, nodeName), pinnedClass(t, scWFFC, nodeName)
	capacityOf := func(t *testing.T, class string) int64 { return capacityOf(t, class, nodeName) }
	start := capacityOf(t, scWFFC)
	if start <= 0 || start > mustQuantity(NodeCapacity) {
		t.Fatalf("capacity for %s is %d, want within (0, %s]", scWFFC, start, NodeCapacity)
	}
	filler := start / 2
	createPVC(t, ns, "filler", immediate, strconv.FormatInt(filler, 10))
	waitBound(t, ns, "filler", time.Minute)
	var after int64
	waitFor(t, "CSIStorageCapacity to drop", time.Minute, func() (bool, error) {
		after = capacityOf(t, scWFFC)
		return after <= start-filler, nil
	})
	t.Logf("CSIStorageCapacity for node %s: %d bytes, %d after a %d-byte volume", harness.NodeName, start, after, filler)

	big := after + mustQuantity("512Mi")
	createPVC(t, ns, "big", wffc, strconv.FormatInt(big, 10))
	createPod(t, ns, "user", pvcVolume("big", "/data"))
	var why string
	waitFor(t, "the pod's FailedScheduling event", time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "Pod", "user") {
			if strings.Contains(e, "FailedScheduling") && strings.Contains(e, "storage") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	if p := getPVC(t, ns, "big"); p.Status.Phase != corev1.ClaimPending {
		t.Fatalf("PVC larger than the free capacity is %s, want Pending", p.Status.Phase)
	}
	t.Logf("a %d-byte PVC with %d bytes free stays Pending: %s", big, after, why)

	if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "filler", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBound(t, ns, "big", 2*time.Minute)
	waitPodRunning(t, ns, "user", 2*time.Minute)
	waitFor(t, "CSIStorageCapacity to follow", time.Minute, func() (bool, error) {
		return capacityOf(t, scWFFC) <= start-big, nil
	})
	t.Logf("after deleting the filler the PVC bound and its pod runs; capacity now %d", capacityOf(t, scWFFC))
}

// 8. Delete: PVC deleted → PV, LocalVolume and data on disk gone; with
// Retain the PV, LocalVolume and data stay. Both on the first node (one
// pod uses both; Immediate binding could place them apart).
func TestDeleteAndRetain(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "delete")
	for _, class := range []string{scImmediate, scRetain} {
		createPVC(t, ns, class, pinnedClass(t, class, harness.NodeName), "16Mi")
	}
	createPod(t, ns, "writer", pvcVolume(scImmediate, "/a"), pvcVolume(scRetain, "/b"))
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	podExec(t, ns, "writer", "echo kept > /a/f && echo kept > /b/f && sync")
	deletePod(t, ns, "writer")
	ids := map[string][2]string{}
	for _, class := range []string{scImmediate, scRetain} {
		pv, id := volumeID(t, ns, class)
		ids[class] = [2]string{pv, id}
		if localVolume(t, id) == nil {
			t.Fatalf("no LocalVolume %s", id)
		}
		if len(onDisk(t, id)) == 0 {
			t.Fatalf("volume %s not found under the data root", id)
		}
		if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, class, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pv, id := ids[scImmediate][0], ids[scImmediate][1]
	waitFor(t, "PV "+pv+" and LocalVolume "+id+" to be deleted", 2*time.Minute, func() (bool, error) {
		_, err := kc.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && localVolume(t, id) == nil, nil
	})
	waitFor(t, "the data of "+id+" to be deleted", time.Minute, func() (bool, error) { return len(onDisk(t, id)) == 0, nil })

	pv, id = ids[scRetain][0], ids[scRetain][1]
	waitFor(t, "PV "+pv+" Released", time.Minute, func() (bool, error) {
		p, err := kc.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.VolumeReleased, nil
	})
	if localVolume(t, id) == nil || len(onDisk(t, id)) == 0 {
		t.Fatalf("Retain: LocalVolume or data of %s gone", id)
	}
	t.Logf("Delete: PV, LocalVolume and data gone; Retain: PV Released, LocalVolume and data kept (%s)", strings.Join(onDisk(t, id), " "))
	// Clean up the retained volume the way an admin would: reclaim Delete.
	if _, err := kc.CoreV1().PersistentVolumes().Patch(ctx, pv, types.MergePatchType,
		[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Delete"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the retained volume to be deleted after reclaim Delete", 2*time.Minute, func() (bool, error) {
		_, err := kc.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && localVolume(t, id) == nil && len(onDisk(t, id)) == 0, nil
	})
}

// 9. Restart: the node plugin is killed while pods use volumes and comes
// back; the pods keep their data, new mounts and unmounts work.
func TestNodePluginRestart(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "restart")
	createPVC(t, ns, "a", scWFFC, "16Mi")
	createPVC(t, ns, "raw", scWFFC, "16Mi", block)
	createPod(t, ns, "app", pvcVolume("a", "/data"), pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	sum := writeBlob(t, ns, "app", "/data/blob", "1Mi")
	podExec(t, ns, "app", "echo before-crash | dd of=/dev/xvda conv=fsync 2>/dev/null")

	on := podNode(t, ns, "app")
	ctx := context.Background()
	if err := on.KillPlugin(ctx); err != nil {
		t.Fatal(err)
	}
	// While it is down (until the kubelet restarts it) the pod still works
	// on its volumes.
	if got := md5In(t, ns, "app", "/data/blob"); got != sum {
		t.Fatalf("with the node plugin down the pod reads md5 %s, want %s", got, sum)
	}
	podExec(t, ns, "app", "echo during >> /data/log")
	if err := on.WaitPluginRestarted(ctx); err != nil {
		t.Fatal(err)
	}
	if got := md5In(t, ns, "app", "/data/blob"); got != sum {
		t.Fatalf("after the restart the pod reads md5 %s, want %s", got, sum)
	}
	if got := podExec(t, ns, "app", "head -c 12 /dev/xvda"); got != "before-crash" {
		t.Fatalf("block device holds %q after the restart", got)
	}
	// New mounts, and unmounting what was mounted before the crash.
	createPVC(t, ns, "b", scWFFC, "16Mi")
	createPod(t, ns, "app2", pvcVolume("b", "/data"), inlineVolume("/scratch", nil), onNode(on.Name))
	waitPodRunning(t, ns, "app2", 2*time.Minute)
	podExec(t, ns, "app2", "echo new > /data/f && echo new > /scratch/f")
	deletePod(t, ns, "app")
	createPod(t, ns, "app3", pvcVolume("a", "/data"), pvcVolume("raw", "/dev/xvda"))
	waitPodRunning(t, ns, "app3", 2*time.Minute)
	if got := md5In(t, ns, "app3", "/data/blob"); got != sum {
		t.Fatalf("after remount md5 %s, want %s", got, sum)
	}
	t.Logf("node plugin of %s killed (SIGKILL) and restarted under running pods: data kept, new fs/inline mounts work, old volumes unmount and mount again", on.Name)
}

// An ext4 StorageClass (csi.storage.k8s.io/fstype): the pod sees a
// filesystem of the PVC's size, less ext4's own overhead (docs/engines.md:
// 15 % at 64 MiB), and a write past it fails with ENOSPC.
func TestImageVolumeSizeInPod(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "image-ext4")
	createPVC(t, ns, "sized", scExt4, "64Mi")
	createPod(t, ns, "user", pvcVolume("sized", "/data"))
	waitPodRunning(t, ns, "user", 2*time.Minute)
	waitBound(t, ns, "sized", time.Minute)
	fields := strings.Fields(strings.TrimSpace(podExec(t, ns, "user", "df -k /data | tail -n 1")))
	if len(fields) < 2 {
		t.Fatalf("df -k /data: %v", fields)
	}
	totalKiB, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		t.Fatalf("df -k /data: %v (%v)", fields, err)
	}
	if totalKiB > 64*1024 || totalKiB < 64*1024*85/100 {
		t.Fatalf("df in the pod shows %d KiB for a 64Mi ext4 PVC, want 64 MiB less at most 15 %%", totalKiB)
	}
	out, err := tryExec(ns, "user", "dd if=/dev/zero of=/data/fill bs=1M count=100 conv=fsync 2>&1")
	if err == nil || !strings.Contains(out, "No space left on device") {
		t.Fatalf("writing 100 MiB into a 64Mi ext4 PVC: err %v, output:\n%s", err, out)
	}
}
