//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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

// podRules returns, for the pod ns/name on the node, the write_bps rule
// for device dev ("maj:min") of each container cgroup below its pod
// cgroup (cgroup v1, the layout of the kubelet's cgroupfs driver under the
// harness's cgroupRoot), "" where there is none.
func podRules(t *testing.T, ns, name, dev string) []string {
	t.Helper()
	pod, err := kc.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uid := string(pod.UID)
	base := filepath.Join("/sys/fs/cgroup/blkio", harness.CgroupRoot, harness.NodeName, "kubepods")
	dirs, _ := filepath.Glob(filepath.Join(base, "*", "pod"+uid))
	if len(dirs) != 1 {
		t.Fatalf("pod %s/%s: cgroup dirs %v under %s", ns, name, dirs, base)
	}
	subs, _ := filepath.Glob(filepath.Join(dirs[0], "*", "blkio.throttle.write_bps_device"))
	var rules []string
	for _, f := range subs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rule := ""
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, dev+" "); ok {
				rule = v
			}
		}
		rules = append(rules, rule)
	}
	return rules
}

// allAre tells whether every rule is want.
func allAre(rules []string, want string) bool {
	for _, r := range rules {
		if r != want {
			return false
		}
	}
	return len(rules) > 0
}

// A VolumeAttributesClass with writeBytesPerSecond on a raw block PVC
// whose pod runs: the node plugin sets the limit on every container cgroup
// of the pod, for the volume's loop device (cgroup
// v1 blkio.throttle.write_bps_device), and the pod's direct writes slow
// down to it (3 MiB at 1 MiB/s: about 3 s, against milliseconds before);
// moved to a class that sets the limit to 0 (none), the rules are gone
// and the writes fast again; moved back, the rules and the slow writes are
// back. A PVC created with the class gets the rules on its pod's
// containers from the start, and its writes are as slow. A directory
// volume cannot take an I/O limit: Infeasible.
func TestVolumeAttributesClassIOLimits(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "vacio")
	createVAC(t, "e2e-vac-slow", map[string]string{"writeBytesPerSecond": "1Mi"})
	createVAC(t, "e2e-vac-unlimited", map[string]string{"writeBytesPerSecond": "0"})
	const write = "if=/dev/zero of=/dev/xvda bs=64k count=48 oflag=direct" // 3 MiB
	devOf := func(pod string) string {
		var maj, min int64
		if _, err := fmt.Sscanf(podExec(t, ns, pod, "stat -c '%t %T' /dev/xvda"), "%x %x", &maj, &min); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%d:%d", maj, min)
	}
	setClass := func(pvc, name string) {
		t.Helper()
		patch := `{"spec":{"volumeAttributesClassName":"` + name + `"}}`
		if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, pvc, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "PVC "+pvc+"'s current VolumeAttributesClass to be "+name, 2*time.Minute, func() (bool, error) {
			p := getPVC(t, ns, pvc)
			return p.Status.CurrentVolumeAttributesClassName != nil && *p.Status.CurrentVolumeAttributesClassName == name, nil
		})
	}

	createPVC(t, ns, "raw", scWFFC, "32Mi", block)
	createPod(t, ns, "app", pvcVolume("raw", "/dev/xvda"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	dev := devOf("app")
	before := ddSeconds(t, ns, "app", write)
	setClass("raw", "e2e-vac-slow")
	if rules := podRules(t, ns, "app", dev); !allAre(rules, "1048576") {
		t.Errorf("after the change to writeBytesPerSecond 1Mi the pod's cgroups hold %q for %s, want 1048576", rules, dev)
	}
	slow := ddSeconds(t, ns, "app", write)
	if slow < 1.5 {
		t.Errorf("3 MiB of direct writes under writeBytesPerSecond=1Mi took %.2f s (%.2f s before the limit)", slow, before)
	}
	setClass("raw", "e2e-vac-unlimited")
	if rules := podRules(t, ns, "app", dev); !allAre(rules, "") {
		t.Errorf("after the change to writeBytesPerSecond 0 the pod's cgroups hold %q for %s, want no rule", rules, dev)
	}
	fast := ddSeconds(t, ns, "app", write)
	if fast > slow/3 {
		t.Errorf("after the limit was removed 3 MiB took %.2f s (%.2f s with it)", fast, slow)
	}
	setClass("raw", "e2e-vac-slow")
	again := ddSeconds(t, ns, "app", write)
	if rules := podRules(t, ns, "app", dev); !allAre(rules, "1048576") || again < 1.5 {
		t.Errorf("after the change back: rules %q for %s, 3 MiB in %.2f s; want 1048576 and about 3 s", rules, dev, again)
	}

	createPVC(t, ns, "born", scWFFC, "32Mi", block, withVAC("e2e-vac-slow"))
	createPod(t, ns, "born", pvcVolume("born", "/dev/xvda"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "born", 2*time.Minute)
	bornDev := devOf("born")
	waitFor(t, "the limit on the cgroups of a pod whose PVC was created with it", time.Minute, func() (bool, error) {
		return allAre(podRules(t, ns, "born", bornDev), "1048576"), nil
	})
	born := ddSeconds(t, ns, "born", write)
	if born < 1.5 {
		t.Errorf("a pod whose PVC was created with writeBytesPerSecond=1Mi wrote 3 MiB directly in %.2f s", born)
	}

	createPVC(t, ns, "dir", scImmediate, "32Mi")
	waitFor(t, "PVC dir Bound", 2*time.Minute, func() (bool, error) {
		return getPVC(t, ns, "dir").Status.Phase == corev1.ClaimBound, nil
	})
	patch := `{"spec":{"volumeAttributesClassName":"e2e-vac-slow"}}`
	if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "dir", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the directory PVC's modify to an I/O limit to be Infeasible", 2*time.Minute, func() (bool, error) {
		p := getPVC(t, ns, "dir")
		return p.Status.ModifyVolumeStatus != nil && p.Status.ModifyVolumeStatus.Status == corev1.PersistentVolumeClaimModifyVolumeInfeasible, nil
	})
	t.Logf("raw block PVC, 3 MiB of direct writes by its running pod: %.2f s with no class, %.2f s at writeBytesPerSecond=1Mi, %.2f s at 0, %.2f s at 1Mi again; a PVC created with 1Mi: %.2f s", before, slow, fast, again, born)
}

// ddSeconds runs dd in the pod (its arguments args) and returns how long
// it took, measured in the pod (/proc/uptime, 10 ms steps).
func ddSeconds(t *testing.T, ns, pod, args string) float64 {
	t.Helper()
	out := podExec(t, ns, pod, "a=$(cut -d' ' -f1 /proc/uptime); dd "+args+" 2>/dev/null || echo FAILED; b=$(cut -d' ' -f1 /proc/uptime); echo $a $b")
	f := strings.Fields(out)
	if len(f) == 2 {
		a, errA := strconv.ParseFloat(f[0], 64)
		b, errB := strconv.ParseFloat(f[1], 64)
		if errA == nil && errB == nil {
			return b - a
		}
	}
	t.Fatalf("dd %s: %q", args, out)
	return 0
}
