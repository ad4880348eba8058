//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/localdir-csi/localdir/pkg/driver"
)

// StorageCapacityScoring under the scheduler's default configuration
// (docs/install.md, "Spreading or packing volumes across nodes"): with one
// node holding 3Gi more free capacity than the other, ten pods with a new
// 256Mi WaitForFirstConsumer volume each (and next to no CPU or memory
// requests, so the storage score decides) go to the freer node, at least
// eight of ten.
func TestVolumesSpreadByFreeCapacity(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	if len(cl.Nodes) < 2 {
		t.Fatalf("needs two nodes, the cluster has %d", len(cl.Nodes))
	}
	freer, fuller := cl.Nodes[0].Name, cl.Nodes[1].Name
	ns := namespace(t, "capacity-scoring")
	createPVC(t, ns, "filler", scWFFC, "3Gi")
	createPod(t, ns, "filler", pvcVolume("filler", "/data"), onNode(fuller), tinyRequests)
	waitPodRunning(t, ns, "filler", 2*time.Minute)
	waitFor(t, "CSIStorageCapacity to show "+fuller+" 2.5Gi fuller than "+freer, time.Minute, func() (bool, error) {
		caps, err := kc.StorageV1().CSIStorageCapacities("localdir").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		free := map[string]int64{}
		for _, c := range caps.Items {
			if c.StorageClassName == scWFFC && c.NodeTopology != nil && c.Capacity != nil {
				free[c.NodeTopology.MatchLabels[driver.TopologyKey]] = c.Capacity.Value()
			}
		}
		return free[freer]-free[fuller] >= mustQuantity("2.5Gi"), nil
	})

	const n = 10
	for i := range n {
		name := fmt.Sprintf("v%d", i)
		createPVC(t, ns, name, scWFFC, "256Mi")
		createPod(t, ns, name, pvcVolume(name, "/data"), tinyRequests)
	}
	on := map[string]int{}
	for i := range n {
		name := fmt.Sprintf("v%d", i)
		waitPodRunning(t, ns, name, 3*time.Minute)
		on[podNode(t, ns, name).Name]++
	}
	t.Logf("%d pods with a new 256Mi volume each: %d on %s (3Gi freer), %d on %s", n, on[freer], freer, on[fuller], fuller)
	if on[freer] < 8 {
		t.Errorf("only %d of %d new volumes went to the node with more free capacity (%v); docs/install.md says the default prefers it", on[freer], n, on)
	}
}

// tinyRequests gives the pod's container requests small enough that
// CPU and memory scores do not tell the nodes apart.
func tinyRequests(p *corev1.Pod) {
	p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("1Mi"),
	}
}
