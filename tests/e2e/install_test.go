//go:build e2e

package e2e

// Issue 15: deploy/ runs as it is. The cluster installs localdir with
// `kubectl apply -k deploy/kubernetes` (harness.Cluster.install): the
// controller Deployment and the node DaemonSet run as pods from images
// built offline. TestHelmInstall swaps that for `helm install` of the chart
// and back.

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// controllerReplicas is the replicas of deploy/'s controller Deployment
// (and of the chart's default).
const controllerReplicas = 2

// localdirPods checks `kubectl -n localdir get pods`: the controller pods
// and one node pod on every node, each Running with every container
// Ready, running the images deploy/ names (kustomization.yaml `images:`),
// and carrying the labels of the install that made them (selector).
func localdirPods(t *testing.T, selector string) []corev1.Pod {
	t.Helper()
	images, err := harness.DeployImages(cl.Root)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, im := range images {
		want[im.Ref()] = true
	}
	pods, err := kc.CoreV1().Pods("localdir").List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pods.Items {
		got = append(got, p.Labels["app.kubernetes.io/component"]+"@"+p.Spec.NodeName)
		if p.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s on %s is %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if !cs.Ready {
				t.Errorf("container %s of pod %s is not Ready", cs.Name, p.Name)
			}
		}
		for _, c := range p.Spec.Containers {
			if !want[c.Image] {
				t.Errorf("container %s of pod %s runs image %s, which deploy/ does not name", c.Name, p.Name, c.Image)
			}
		}
	}
	sort.Strings(got)
	var exp []string
	for _, n := range cl.Nodes {
		exp = append(exp, "node@"+n.Name)
	}
	sort.Strings(exp)
	ctrls := 0
	for _, g := range got {
		if strings.HasPrefix(g, "controller@") {
			ctrls++
		}
	}
	if ctrls != controllerReplicas || strings.Join(got[ctrls:], " ") != strings.Join(exp, " ") {
		t.Fatalf("localdir pods (component@node) %v, want %d controllers and %v", got, controllerReplicas, exp)
	}
	return pods.Items
}

// The cluster's localdir is deploy/kubernetes's Deployment and DaemonSet
// as pods: the controllers and one node pod per node Running, no container
// ever ended but by a test's SIGKILL, the node plugin privileged as root,
// the only container of its pod with an API token,
// and serving its metrics on its pod's IP on each node, and no localdir
// process outside the pods.
func TestDeployRunsAsPods(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	for _, p := range localdirPods(t, "app.kubernetes.io/name=localdir") {
		for _, cs := range p.Status.ContainerStatuses {
			// SIGKILLed on purpose by other scenarios (exit 137), never
			// ended by a crash, an exit or a failed liveness probe.
			if term := cs.LastTerminationState.Terminated; term != nil && term.ExitCode != 137 {
				t.Errorf("container %s of pod %s last ended %s (exit %d): %s", cs.Name, p.Name, term.Reason, term.ExitCode, term.Message)
			}
		}
		if p.Labels["app.kubernetes.io/component"] == "node" {
			if !podHasPrivilegedRoot(p, "localdir") {
				t.Errorf("the node plugin of pod %s is not privileged as root", p.Name)
			}
			// Only the driver holds the API token: the registrar and the
			// livenessprobe do not use the API.
			for _, c := range p.Spec.Containers {
				has := false
				for _, m := range c.VolumeMounts {
					has = has || m.MountPath == "/var/run/secrets/kubernetes.io/serviceaccount"
				}
				if has != (c.Name == "localdir") {
					t.Errorf("container %s of node pod %s: API token mounted %v, want it in the localdir container only", c.Name, p.Name, has)
				}
			}
		}
	}
	for _, n := range cl.Nodes {
		addr, err := n.MetricsAddress(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m := scrapeMetrics(t, addr); m[`localdir_allocatable_bytes{node="`+n.Name+`"}`] <= 0 {
			t.Errorf("node plugin of %s (%s) reports no allocatable bytes", n.Name, addr)
		}
	}
	if out := driverOutsidePods(); out != "" {
		t.Fatalf("localdir processes outside the pods' containers: %s", out)
	}
	t.Logf("kubectl apply -k deploy/kubernetes: controller and %d node pods Running from the images deploy/ names", len(cl.Nodes))
}

// podHasPrivilegedRoot tells whether container name of p runs privileged
// with user 0 (the image's own user is 65532).
func podHasPrivilegedRoot(p corev1.Pod, name string) bool {
	for _, c := range p.Spec.Containers {
		if c.Name == name && c.SecurityContext != nil {
			sc := c.SecurityContext
			return sc.Privileged != nil && *sc.Privileged && sc.RunAsUser != nil && *sc.RunAsUser == 0
		}
	}
	return false
}

// driverOutsidePods lists the localdir-csi processes on this machine that
// do not run in a pod's container (their cgroup is not under a kubelet's
// kubepods of the cluster's cgroup root).
func driverOutsidePods() string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(string(b), "\x00")
		if filepath.Base(argv[0]) != "localdir-csi" {
			continue
		}
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if !strings.Contains(string(cg), "/"+harness.CgroupRoot+"/") || !strings.Contains(string(cg), "/kubepods/") {
			out = append(out, e.Name()+": "+strings.Join(argv, " "))
		}
	}
	return strings.Join(out, "; ")
}

// `helm install` of deploy/helm/localdir in place of the kustomize
// install: the chart's pods run on every node, a PVC on each node binds
// and holds its data there, a snapshot is taken with the chart's
// VolumeSnapshotClass, deletes remove the data, and `helm uninstall`
// removes the pods. The kustomize install comes back afterwards.
func TestHelmInstall(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	if err := cl.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	helm, kustomize := false, false
	defer func() {
		if helm {
			if err := cl.HelmUninstall(ctx); err != nil {
				t.Errorf("helm uninstall: %v", err)
			}
		}
		if !kustomize {
			if err := cl.Reinstall(ctx); err != nil {
				t.Errorf("install deploy/kubernetes again: %v", err)
			}
		}
	}()
	t0 := time.Now()
	// Uninstalled below even when the install fails half-way: kustomize
	// cannot apply over the chart's objects.
	helm = true
	if err := cl.HelmInstall(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install: pods Running and the driver registered on every node in %.1fs", time.Since(t0).Seconds())
	localdirPods(t, "app.kubernetes.io/managed-by=Helm,app.kubernetes.io/instance="+harness.HelmRelease)

	ns := namespace(t, "helm")
	ids := map[string]string{}
	sums := map[string]string{}
	for _, n := range cl.Nodes {
		pvc, pod := "data-"+n.Name, "app-"+n.Name
		createPVC(t, ns, pvc, scWFFC, "16Mi")
		createPod(t, ns, pod, pvcVolume(pvc, "/data"), onNode(n.Name))
		waitPodRunning(t, ns, pod, 2*time.Minute)
		sums[n.Name] = writeBlob(t, ns, pod, "/data/blob", "1Mi")
		_, ids[n.Name] = volumeID(t, ns, pvc)
		mustBeOnlyOn(t, ids[n.Name], n)
	}
	first := cl.Nodes[0]
	sid := snapshotOf(t, ns, "snap", "data-"+first.Name)
	mustBeOnlyOn(t, sid, first)
	for _, n := range cl.Nodes {
		if got := md5In(t, ns, "app-"+n.Name, "/data/blob"); got != sums[n.Name] {
			t.Fatalf("pod on %s reads md5 %s, wrote %s", n.Name, got, sums[n.Name])
		}
		deletePod(t, ns, "app-"+n.Name)
	}
	if err := dyn.Resource(gvrSnapshot).Namespace(ns).Delete(ctx, "snap", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range cl.Nodes {
		if err := kc.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data-"+n.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the volumes and the snapshot deleted from every node", 2*time.Minute, func() (bool, error) {
		left := len(onDisk(t, sid))
		for _, id := range ids {
			left += len(onDisk(t, id))
		}
		return left == 0, nil
	})

	if err := cl.HelmUninstall(ctx); err != nil {
		t.Fatal(err)
	}
	helm = false
	if pods, err := kc.CoreV1().Pods("localdir").List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Fatalf("pods in namespace localdir after helm uninstall: %v %v", pods, err)
	}
	if err := cl.Reinstall(ctx); err != nil {
		t.Fatal(err)
	}
	kustomize = true
	t.Logf("helm install: %d node pods and the controller Running, a PVC on each node with its data only there, a snapshot; helm uninstall removed the pods; kustomize install back", len(cl.Nodes))
}
