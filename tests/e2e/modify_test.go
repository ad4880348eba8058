//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// withVAC gives a PVC a VolumeAttributesClass.
func withVAC(name string) pvcOpt {
	return func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeAttributesClassName = &name }
}

// createVAC creates a VolumeAttributesClass of localdir (deleted when the
// test ends).
func createVAC(t *testing.T, name string, params map[string]string) {
	t.Helper()
	ctx := context.Background()
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: name}, DriverName: harness.DriverName, Parameters: params}
	if _, err := kc.StorageV1().VolumeAttributesClasses().Create(ctx, vac, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.StorageV1().VolumeAttributesClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// VolumeAttributesClass: a PVC created with a class whose dirMode is
// 0750 shows a pod that mode on its volume's root; changing the PVC to a
// class with dirMode 0700 and compression zstd changes the running pod's
// volume once csi-resizer reports the class current: the root's mode, and
// 48 MiB of text that did not fit in the 32Mi volume (btrfs quotas count
// bytes on disk) fit once compressed; a
// class with a value localdir refuses ends as Infeasible on the PVC and
// changes nothing.
func TestVolumeAttributesClass(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "vac")
	createVAC(t, "e2e-vac-0750", map[string]string{"dirMode": "0750"})
	createVAC(t, "e2e-vac-zstd", map[string]string{"dirMode": "0700", "compression": "zstd"})
	createVAC(t, "e2e-vac-bad", map[string]string{"compression": "brotli"})
	createPVC(t, ns, "data", scWFFC, "32Mi", withVAC("e2e-vac-0750"))
	createPod(t, ns, "app", pvcVolume("data", "/data"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	if got := podExec(t, ns, "app", "stat -c %a /data"); got != "750" {
		t.Fatalf("mode of the volume's root in the pod with dirMode 0750: %s", got)
	}
	// 48 MiB of text do not fit in the 32Mi volume: its btrfs quota
	// counts the bytes on disk.
	const text = "yes 'localdir keeps this line' | head -c 50331648 2>&1 >/data/text && sync 2>&1 && echo WROTE; rm -f /data/text"
	// (btrfs reports the quota as EDQUOT or, from writeback, EIO.)
	if out := podExec(t, ns, "app", text); strings.Contains(out, "WROTE") || !strings.Contains(out, "error") {
		t.Fatalf("writing 48 MiB of text into the 32Mi volume without compression: %q, want a write error", out)
	}
	_, id := volumeID(t, ns, "data")

	setVAC := func(name string) {
		t.Helper()
		patch := `{"spec":{"volumeAttributesClassName":"` + name + `"}}`
		if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setVAC("e2e-vac-zstd")
	waitFor(t, "the PVC's current VolumeAttributesClass to be e2e-vac-zstd", 2*time.Minute, func() (bool, error) {
		p := getPVC(t, ns, "data")
		return p.Status.CurrentVolumeAttributesClassName != nil && *p.Status.CurrentVolumeAttributesClassName == "e2e-vac-zstd", nil
	})
	if got := podExec(t, ns, "app", "stat -c %a /data"); got != "700" {
		t.Errorf("mode of the volume's root in the running pod after the change to dirMode 0700: %s", got)
	}
	// Compressed, the same 48 MiB of text take a fraction of that on
	// disk: they fit now.
	if out := podExec(t, ns, "app", text); !strings.Contains(out, "WROTE") {
		t.Errorf("writing 48 MiB of text into the 32Mi volume after compression=zstd: %q, want it to fit", out)
	}
	lv := localVolume(t, id)
	if c, _, _ := unstructured.NestedString(lv.Object, "status", "mutableParameters", "compression"); c != "zstd" {
		t.Errorf("LocalVolume %s status.mutableParameters.compression = %q, want zstd", id, c)
	}

	setVAC("e2e-vac-bad")
	waitFor(t, "the PVC's modify to e2e-vac-bad to be Infeasible", 2*time.Minute, func() (bool, error) {
		p := getPVC(t, ns, "data")
		return p.Status.ModifyVolumeStatus != nil && p.Status.ModifyVolumeStatus.Status == corev1.PersistentVolumeClaimModifyVolumeInfeasible, nil
	})
	p := getPVC(t, ns, "data")
	if p.Status.CurrentVolumeAttributesClassName == nil || *p.Status.CurrentVolumeAttributesClassName != "e2e-vac-zstd" {
		t.Errorf("after the infeasible modify the current class is %v, want e2e-vac-zstd still", p.Status.CurrentVolumeAttributesClassName)
	}
	if got := podExec(t, ns, "app", "stat -c %a /data"); got != "700" {
		t.Errorf("mode after the infeasible modify: %s, want 700 still", got)
	}
	t.Logf("VolumeAttributesClass: dirMode 0750 at create, changed to 0700 + zstd on the running pod's volume, brotli Infeasible")
}
