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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

var (
	gvrGroupSnapshot      = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshots"}
	gvrGroupSnapshotClass = schema.GroupVersionResource{Group: "groupsnapshot.storage.k8s.io", Version: "v1", Resource: "volumegroupsnapshotclasses"}
)

// withLabel labels a PVC.
func withLabel(k, v string) pvcOpt {
	return func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{k: v} }
}

// VolumeGroupSnapshot of two PVCs that one pod writes in a known order:
// the same number to the first volume, then to the second, each write
// synced and renamed into place before the next. The group snapshot
// (csi-snapshotter, snapshot-controller, localdir's GroupController) is
// ready with one VolumeSnapshot per PVC; the pair restored from it shows
// the second volume at the first's number or the one before, never later.
// Three kinds of volume: ext4 image volumes (their filesystems frozen
// together), directory volumes and raw block volumes (the writing pod
// frozen).
func TestVolumeGroupSnapshot(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	class := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass",
		"metadata": map[string]any{"name": "e2e-localdir-group"}, "driver": harness.DriverName, "deletionPolicy": "Delete",
	}}
	if _, err := dyn.Resource(gvrGroupSnapshotClass).Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(gvrGroupSnapshotClass).Delete(context.Background(), "e2e-localdir-group", metav1.DeleteOptions{})
	})
	for _, sc := range []string{scExt4, scWFFC} {
		t.Run(sc, func(t *testing.T) { groupOfTwo(t, sc, false) })
	}
	t.Run("raw-block", func(t *testing.T) { groupOfTwo(t, scWFFC, true) })
}

// groupOfTwo is TestVolumeGroupSnapshot for two PVCs of class sc, raw
// block ones when raw: then the pod writes "<volume name> <number>" to the
// first 16 bytes of each device, synced.
func groupOfTwo(t *testing.T, sc string, raw bool) {
	ctx := context.Background()
	ns := namespace(t, "group")
	opts := []pvcOpt{withLabel("group", "pair")}
	at := func(v string) string { return "/" + v }
	loop := `echo first > /first/name; echo second > /second/name; sync; i=0; trap 'exit 0' TERM; ` +
		`while true; do i=$((i+1)); for v in first second; do echo $i | dd of=/$v/seq.tmp conv=fsync 2>/dev/null; mv /$v/seq.tmp /$v/seq; done; done`
	// read is the script that prints "<volume name> <number>" of the
	// volume at path.
	read := func(path string) string { return "echo $(cat " + path + "/name) $(cat " + path + "/seq)" }
	if raw {
		opts = append(opts, block)
		at = func(v string) string { return "/dev/" + v }
		loop = `i=0; trap 'exit 0' TERM; while true; do i=$((i+1)); for v in first second; do ` +
			`printf '%s %-8s\n' $v $i | dd of=/dev/$v bs=16 count=1 conv=fsync,notrunc 2>/dev/null; done; done`
		read = func(path string) string { return "dd if=" + path + " bs=16 count=1 2>/dev/null" }
	}
	createPVC(t, ns, "first", sc, "64Mi", opts...)
	createPVC(t, ns, "second", sc, "64Mi", opts...)
	createPod(t, ns, "writer", pvcVolume("first", at("first")), pvcVolume("second", at("second")), onNode(harness.NodeName),
		func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"sh", "-c", loop} })
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	waitFor(t, "the writer to be writing", time.Minute, func() (bool, error) {
		out, err := tryExec(ns, "writer", read(at("second"))+" 2>/dev/null || echo none 0")
		f := strings.Fields(strings.ReplaceAll(out, "\x00", ""))
		n := 0
		if len(f) == 2 {
			n, _ = strconv.Atoi(f[1])
		}
		return err == nil && n > 20, nil
	})

	group := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
		"metadata": map[string]any{"name": "pair"},
		"spec": map[string]any{"volumeGroupSnapshotClassName": "e2e-localdir-group",
			"source": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"group": "pair"}}}},
	}}
	if _, err := dyn.Resource(gvrGroupSnapshot).Namespace(ns).Create(ctx, group, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "VolumeGroupSnapshot readyToUse", 2*time.Minute, func() (bool, error) {
		u, err := dyn.Resource(gvrGroupSnapshot).Namespace(ns).Get(ctx, "pair", metav1.GetOptions{})
		if err != nil {
			return false, retryTransient(t, err)
		}
		ready, _, _ := unstructured.NestedBool(u.Object, "status", "readyToUse")
		if msg, ok, _ := unstructured.NestedString(u.Object, "status", "error", "message"); ok && !ready {
			return false, retryTransientMessage(t, "VolumeGroupSnapshot status.error", msg)
		}
		return ready, nil
	})
	if err := kc.CoreV1().Pods(ns).Delete(ctx, "writer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	snaps, err := dyn.Resource(gvrSnapshot).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, s := range snaps.Items {
		for _, o := range s.GetOwnerReferences() {
			if o.Kind == "VolumeGroupSnapshot" && o.Name == "pair" {
				members = append(members, s.GetName())
			}
		}
	}
	if len(members) != 2 {
		t.Fatalf("VolumeSnapshots of the group: %v, want two", members)
	}
	var vols []podOpt
	for i, m := range members {
		name := fmt.Sprintf("restored-%d", i)
		createPVC(t, ns, name, sc, "64Mi", append(opts[1:], withSource("VolumeSnapshot", m))...)
		vols = append(vols, pvcVolume(name, at(name)))
	}
	createPod(t, ns, "reader", append(vols, onNode(harness.NodeName))...)
	waitPodRunning(t, ns, "reader", 2*time.Minute)
	seq := map[string]int{}
	for i := range members {
		// (A raw block record is padded to 16 bytes with NULs.)
		out := podExec(t, ns, "reader", read(at(fmt.Sprintf("restored-%d", i))))
		f := strings.Fields(strings.ReplaceAll(out, "\x00", ""))
		if len(f) != 2 {
			t.Fatalf("restored volume %d: %q", i, out)
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			t.Fatal(err)
		}
		seq[f[0]] = n
	}
	if len(seq) != 2 || seq["first"] < 1 || (seq["second"] != seq["first"] && seq["second"] != seq["first"]-1) {
		t.Fatalf("restored group: first at %d, second at %d; the second must be at the first's number or the one before", seq["first"], seq["second"])
	}
	t.Logf("group snapshot of two PVCs of class %s (raw block: %v) under a writer: restored first at %d, second at %d", sc, raw, seq["first"], seq["second"])
}
