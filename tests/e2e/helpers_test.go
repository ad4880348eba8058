//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// StorageClasses. "localdir" (WaitForFirstConsumer, Delete) comes from
// deploy/kubernetes; the tests add these.
const (
	scWFFC      = "localdir"
	scImmediate = "e2e-immediate"
	scRetain    = "e2e-retain"
	sc0750      = "e2e-dirmode-0750"
	scExt4      = "e2e-ext4"
)

var (
	gvrSnapshot    = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	gvrLocalVolume = schema.GroupVersionResource{Group: "localdir.csi.dev", Version: "v1alpha1", Resource: "localvolumes"}
	gvrLocalNode   = schema.GroupVersionResource{Group: "localdir.csi.dev", Version: "v1alpha1", Resource: "localnodes"}
)

func createClasses() error {
	ctx := context.Background()
	immediate, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	del, retain := corev1.PersistentVolumeReclaimDelete, corev1.PersistentVolumeReclaimRetain
	yes := true
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: scImmediate}, Provisioner: harness.DriverName, VolumeBindingMode: &immediate, ReclaimPolicy: &del, AllowVolumeExpansion: &yes},
		{ObjectMeta: metav1.ObjectMeta{Name: scRetain}, Provisioner: harness.DriverName, VolumeBindingMode: &immediate, ReclaimPolicy: &retain},
		{ObjectMeta: metav1.ObjectMeta{Name: sc0750}, Provisioner: harness.DriverName, VolumeBindingMode: &wffc, ReclaimPolicy: &del,
			Parameters: map[string]string{"dirMode": "0750"}},
		{ObjectMeta: metav1.ObjectMeta{Name: scExt4}, Provisioner: harness.DriverName, VolumeBindingMode: &wffc, ReclaimPolicy: &del, AllowVolumeExpansion: &yes,
			Parameters: map[string]string{"csi.storage.k8s.io/fstype": "ext4"}},
	} {
		if _, err := kc.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// namespace creates a namespace for one test; cleanup deletes it and waits
// until its PVs (reclaim policy Delete) and their volumes are gone.
func namespace(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	ns := "e2e-" + name
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Pods need the namespace's default ServiceAccount.
	waitFor(t, "default ServiceAccount in "+ns, time.Minute, func() (bool, error) {
		_, err := kc.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	t.Cleanup(func() {
		if t.Failed() {
			dump(t, ns)
		}
		zero := int64(0)
		_ = kc.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		_ = kc.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		waitFor(t, "namespace "+ns+" to be deleted", 3*time.Minute, func() (bool, error) {
			_, err := kc.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		waitFor(t, "the PVs of "+ns+" to be deleted", 3*time.Minute, func() (bool, error) {
			pvs, err := kc.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, retryTransient(t, err)
			}
			for _, pv := range pvs.Items {
				if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
					return false, nil
				}
			}
			return true, nil
		})
	})
	return ns
}

// dump logs the namespace's objects and events when a test failed.
func dump(t testing.TB, ns string) {
	for _, args := range [][]string{
		{"get", "pods,pvc,volumesnapshots", "-n", ns, "-o", "wide"},
		{"get", "pv,localvolumes"},
		{"get", "events", "-n", ns, "--sort-by=.lastTimestamp"},
	} {
		out, err := cl.Kubectl(context.Background(), "", args...)
		t.Logf("kubectl %s:\n%s%v", strings.Join(args, " "), out, errString(err))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return "\n" + err.Error()
}

type pvcOpt func(*corev1.PersistentVolumeClaim)

func withSource(kind, name string) pvcOpt {
	return func(p *corev1.PersistentVolumeClaim) {
		ref := &corev1.TypedLocalObjectReference{Kind: kind, Name: name}
		if kind == "VolumeSnapshot" {
			g := "snapshot.storage.k8s.io"
			ref.APIGroup = &g
		}
		p.Spec.DataSource = ref
	}
}

func block(p *corev1.PersistentVolumeClaim) {
	m := corev1.PersistentVolumeBlock
	p.Spec.VolumeMode = &m
}

func createPVC(t testing.TB, ns, name, class, size string, opts ...pvcOpt) *corev1.PersistentVolumeClaim {
	t.Helper()
	p := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	p, err := kc.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type podOpt func(*corev1.Pod)

// pvcVolume mounts claim at path (or, for a block PVC, maps it there).
func pvcVolume(claim, path string) podOpt {
	return func(p *corev1.Pod) {
		name := fmt.Sprintf("v%d", len(p.Spec.Volumes))
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		c := &p.Spec.Containers[0]
		if strings.HasPrefix(path, "/dev/") {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: name, DevicePath: path})
		} else {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: path})
		}
	}
}

// inlineVolume is a CSI ephemeral inline volume of localdir.
func inlineVolume(path string, attrs map[string]string) podOpt {
	return func(p *corev1.Pod) {
		name := fmt.Sprintf("v%d", len(p.Spec.Volumes))
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name,
			VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: harness.DriverName, VolumeAttributes: attrs}}})
		c := &p.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: path})
	}
}

// onNode pins the pod to a node (its kubernetes.io/hostname label).
func onNode(name string) podOpt {
	return func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": name} }
}

// node is the cluster's node of that name.
func node(t testing.TB, name string) *harness.Node {
	t.Helper()
	for _, n := range cl.Nodes {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %q in the cluster", name)
	return nil
}

// pvNode is the node a bound PVC's PV is pinned to by localdir's topology
// key (its only node affinity term).
func pvNode(t testing.TB, ns, pvc string) *harness.Node {
	t.Helper()
	p := getPVC(t, ns, pvc)
	pv, err := kc.CoreV1().PersistentVolumes().Get(context.Background(), p.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		t.Fatalf("PV %s has no node affinity", pv.Name)
	}
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != topologyKey ||
		len(terms[0].MatchExpressions[0].Values) != 1 {
		t.Fatalf("PV %s node affinity = %+v, want one %s term", pv.Name, terms, topologyKey)
	}
	return node(t, terms[0].MatchExpressions[0].Values[0])
}

// podNode is the node a pod was scheduled to.
func podNode(t testing.TB, ns, pod string) *harness.Node {
	t.Helper()
	p, err := kc.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return node(t, p.Spec.NodeName)
}

// topologyKey is localdir's topology key (accessible_topology segment).
const topologyKey = "topology.localdir.csi.dev/node"

// pinnedClass returns the name of a copy of StorageClass base whose
// allowedTopologies hold only the given node, creating it on first use.
func pinnedClass(t testing.TB, base, nodeName string) string {
	t.Helper()
	ctx := context.Background()
	sc, err := kc.StorageV1().StorageClasses().Get(ctx, base, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pinned := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: base + "-" + nodeName},
		Provisioner: sc.Provisioner, Parameters: sc.Parameters, ReclaimPolicy: sc.ReclaimPolicy, MountOptions: sc.MountOptions,
		AllowVolumeExpansion: sc.AllowVolumeExpansion, VolumeBindingMode: sc.VolumeBindingMode,
		AllowedTopologies: []corev1.TopologySelectorTerm{{MatchLabelExpressions: []corev1.TopologySelectorLabelRequirement{
			{Key: topologyKey, Values: []string{nodeName}}}}}}
	if _, err := kc.StorageV1().StorageClasses().Create(ctx, pinned, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return pinned.Name
}

func securityContext(sc *corev1.PodSecurityContext) podOpt {
	return func(p *corev1.Pod) { p.Spec.SecurityContext = sc }
}

// createPod runs busybox sleeping (to exec into) with the given volumes.
func createPod(t testing.TB, ns, name string, opts ...podOpt) *corev1.Pod {
	t.Helper()
	p, err := kc.CoreV1().Pods(ns).Create(context.Background(), podSpec(name, opts...), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// podSpec is the pod createPod creates.
func podSpec(name string, opts ...podOpt) *corev1.Pod {
	grace := int64(1)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name: "app", Image: harness.BusyboxImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"},
			}},
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func waitPodRunning(t testing.TB, ns, name string, timeout time.Duration) {
	t.Helper()
	waitFor(t, "pod "+ns+"/"+name+" Running", timeout, func() (bool, error) {
		p, err := kc.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, retryTransient(t, err)
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod ended: %s", p.Status.Phase)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.Ready {
				return true, nil
			}
		}
		return false, nil
	})
}

func deletePod(t testing.TB, ns, name string) {
	t.Helper()
	ctx := context.Background()
	if err := kc.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "pod "+ns+"/"+name+" gone", 2*time.Minute, func() (bool, error) {
		_, err := kc.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func getPVC(t testing.TB, ns, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	p, err := kc.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func waitBound(t testing.TB, ns, name string, timeout time.Duration) *corev1.PersistentVolumeClaim {
	t.Helper()
	var pvc *corev1.PersistentVolumeClaim
	waitFor(t, "PVC "+ns+"/"+name+" Bound", timeout, func() (bool, error) {
		p, err := kc.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
		pvc = p
		return err == nil && p.Status.Phase == corev1.ClaimBound, nil
	})
	return pvc
}

// podExec runs a shell command in the pod's container (kubectl exec) and
// returns its output; it fails the test if the command fails.
func podExec(t testing.TB, ns, pod, script string) string {
	t.Helper()
	out, err := tryExec(ns, pod, script)
	if err != nil {
		t.Fatalf("in pod %s/%s: %s: %v", ns, pod, script, err)
	}
	return out
}

func tryExec(ns, pod, script string) (string, error) {
	return cl.Kubectl(context.Background(), "", "exec", "-n", ns, pod, "--", "sh", "-c", script)
}

// events lists the messages of events about an object.
func events(t testing.TB, ns, kind, name string) []string {
	t.Helper()
	ev, err := kc.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fmt.Sprintf("involvedObject.kind=%s,involvedObject.name=%s", kind, name)})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ev.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// retryTransient returns nil, so that a waitFor condition polls again
// (within its deadline), for an error that says the API server was busy or
// briefly unreachable (server timeout, too many requests, service
// unavailable, connection refused or reset); any other error is returned
// and fails the wait.
func retryTransient(t testing.TB, err error) error {
	t.Helper()
	if apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) {
		t.Logf("transient API error, polling again: %v", err)
		return nil
	}
	return err
}

// transientMessages are the errors a controller records in an object's
// status and then retries by itself: an optimistic-lock conflict with
// another writer, or the API server busy or unreachable for a moment.
var transientMessages = []string{
	"the object has been modified; please apply your changes to the latest version",
	"connection refused",
	"the server is currently unable to handle the request",
	"the server was unable to return a response in the time allotted",
	"Too many requests",
}

// retryTransientMessage is retryTransient for an error message a
// controller recorded in a status (what): nil for the messages above,
// an error naming it otherwise.
func retryTransientMessage(t testing.TB, what, msg string) error {
	t.Helper()
	for _, m := range transientMessages {
		if strings.Contains(msg, m) {
			t.Logf("%s is transient, polling again: %s", what, msg)
			return nil
		}
	}
	return fmt.Errorf("%s: %s", what, msg)
}

// localVolume returns the LocalVolume of a bound PVC's PV (the volume id is
// its name), or nil when there is none.
func localVolume(t testing.TB, id string) *unstructured.Unstructured {
	t.Helper()
	u, err := dyn.Resource(gvrLocalVolume).Get(context.Background(), id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func volumeID(t testing.TB, ns, pvc string) (pvName, id string) {
	t.Helper()
	p := getPVC(t, ns, pvc)
	pv, err := kc.CoreV1().PersistentVolumes().Get(context.Background(), p.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pv.Spec.CSI == nil {
		t.Fatalf("PV %s is not a CSI volume", pv.Name)
	}
	return pv.Name, pv.Spec.CSI.VolumeHandle
}

// onDisk lists the paths under every node's data root (seen from the
// host through the node's namespaces), two levels deep (volumes/<id>,
// block/<id>.img, snapshots/<id>), whose name contains s.
func onDisk(t testing.TB, s string) []string {
	t.Helper()
	var out []string
	for _, n := range cl.Nodes {
		out = append(out, onNodeDisk(t, n, s)...)
	}
	return out
}

// onNodeDisk is onDisk on one node.
func onNodeDisk(t testing.TB, n *harness.Node, s string) []string {
	t.Helper()
	root := n.Path(harness.DataRoot)
	if _, err := os.Stat(root); err != nil {
		t.Fatalf("node %s's data root cannot be read from the host: %v", n.Name, err)
	}
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == root {
			return nil
		}
		rel := strings.TrimPrefix(p, root)
		if strings.Contains(d.Name(), s) {
			out = append(out, rel)
		}
		if d.IsDir() && strings.Count(rel, "/") >= 2 {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mustQuantity(s string) int64 { q := resource.MustParse(s); return q.Value() }
