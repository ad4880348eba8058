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
	"k8s.io/apimachinery/pkg/types"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// Recovery from an impossible expansion (KEP-1790, GA in 1.34): a PVC
// resized past its node's whole capacity is answered OUT_OF_RANGE, which
// the resizer marks ControllerResizeInfeasible with localdir's message
// naming the node's room; the user lowers the request to what fits and the
// volume grows to that, seen by its pod.
func TestResizePastTheNodeThenLowered(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	ns := namespace(t, "resize-infeasible")
	createPVC(t, ns, "raw", scWFFC, "32Mi", block)
	createPod(t, ns, "app", pvcVolume("raw", "/dev/xvda"), onNode(harness.NodeName))
	waitPodRunning(t, ns, "app", 2*time.Minute)
	waitBound(t, ns, "raw", time.Minute)
	resize := func(size string) {
		patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size)
		if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "raw", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	resize("100Gi") // the nodes hold 6Gi (--capacity)
	waitFor(t, "PVC raw marked ControllerResizeInfeasible", 2*time.Minute, func() (bool, error) {
		p := getPVC(t, ns, "raw")
		return p.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimControllerResizeInfeasible, nil
	})
	var msg string
	for _, e := range events(t, ns, "PersistentVolumeClaim", "raw") {
		if strings.Contains(e, "holds") && strings.Contains(e, "bytes in all") {
			msg = e
		}
	}
	if msg == "" {
		t.Errorf("no Event on PVC raw names the node's room: %v", events(t, ns, "PersistentVolumeClaim", "raw"))
	}
	t.Logf("100Gi on a 6Gi node: %s", msg)

	resize("48Mi")
	waitFor(t, "PVC raw grown to the lowered 48Mi", 2*time.Minute, func() (bool, error) {
		p := getPVC(t, ns, "raw")
		q := p.Status.Capacity[corev1.ResourceStorage]
		_, marked := p.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
		return q.Value() == mustQuantity("48Mi") && !marked, nil
	})
	waitFor(t, "the pod to see the block device at 48Mi", time.Minute, func() (bool, error) {
		out, err := tryExec(ns, "app", "blockdev --getsize64 /dev/xvda")
		return err == nil && out == strconv.FormatInt(mustQuantity("48Mi"), 10), nil
	})
}
