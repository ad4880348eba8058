//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrapeMetrics reads a /metrics page into "name{labels}" → value: the
// localdir_ series and the node agent's controller-runtime ones
// (controller_runtime_, workqueue_).
func scrapeMetrics(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "localdir_") && !strings.HasPrefix(line, "controller_runtime_") && !strings.HasPrefix(line, "workqueue_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestMetricsAndUnplaceablePVC scrapes the controller's and the node
// plugin's /metrics while volumes are created and one cannot be placed:
// the RPC, capacity and error series move, the node agent's reconcile
// and work queue series count the new volume, and the PVC that does not
// fit carries an event saying why.
func TestMetricsAndUnplaceablePVC(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "metrics")
	// On the first node (a class pinned to it), whose metrics are read.
	on := cl.Nodes[0]
	// The pods' IPs: deploy/ serves metrics on port 9810 of each pod.
	ctx := context.Background()
	ctrlAddr, err := cl.ControllerMetricsAddress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr, err := on.MetricsAddress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ctrlBefore := scrapeMetrics(t, ctrlAddr)
	nodeBefore := scrapeMetrics(t, nodeAddr)
	okKey := `localdir_rpc_requests_total{code="OK",method="CreateVolume"}`
	exhaustedKey := `localdir_rpc_requests_total{code="ResourceExhausted",method="CreateVolume"}`
	allocKey := `localdir_allocatable_bytes{node="` + on.Name + `"}`
	reconciledKey := `controller_runtime_reconcile_total{controller="localvolume",result="success"}`
	queuedKey := `workqueue_queue_duration_seconds_count{controller="localvolume",name="localvolume"}`

	createPVC(t, ns, "fits", pinnedClass(t, scImmediate, on.Name), "64Mi")
	waitBound(t, ns, "fits", time.Minute)
	// Far larger than the node's capacity: no node can take it.
	createPVC(t, ns, "too-big", scImmediate, "1Ti")
	var why string
	waitFor(t, "the ProvisioningFailed event of the PVC that does not fit", 2*time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "PersistentVolumeClaim", "too-big") {
			if strings.Contains(e, "ProvisioningFailed") && strings.Contains(e, "not enough capacity") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("event on the PVC that cannot be placed: %s", why)
	for _, n := range cl.Nodes {
		if !strings.Contains(why, n.Name) {
			t.Errorf("the event does not name node %s: %s", n.Name, why)
		}
	}
	if !strings.Contains(why, "free space on a node, pick a smaller size, or add nodes") {
		t.Errorf("the event does not say what to change: %s", why)
	}

	var ctrlAfter, nodeAfter map[string]float64
	waitFor(t, "the metrics to show the new volume and the failure", time.Minute, func() (bool, error) {
		ctrlAfter = scrapeMetrics(t, ctrlAddr)
		nodeAfter = scrapeMetrics(t, nodeAddr)
		return ctrlAfter[okKey] > ctrlBefore[okKey] && ctrlAfter[exhaustedKey] > ctrlBefore[exhaustedKey] &&
			nodeAfter[allocKey] <= nodeBefore[allocKey]-64<<20 &&
			nodeAfter[reconciledKey] > nodeBefore[reconciledKey] && nodeAfter[queuedKey] > nodeBefore[queuedKey], nil
	})
	depth := false
	for k := range nodeAfter {
		depth = depth || strings.HasPrefix(k, `workqueue_depth{controller="localvolume",`)
	}
	if !depth {
		t.Errorf("the node plugin serves no work queue depth of its LocalVolume reconciler")
	}
	for _, n := range cl.Nodes {
		if ctrlAfter[`localdir_capacity_bytes{node="`+n.Name+`"}`] <= 0 {
			t.Errorf("controller reports no capacity for node %s", n.Name)
		}
	}
	if ctrlAfter[`localdir_volumes{node="`+on.Name+`",phase="Ready"}`] < 1 {
		t.Errorf("controller reports no Ready volume on %s", on.Name)
	}
	t.Logf("CreateVolume OK %v→%v, ResourceExhausted %v→%v; node allocatable %v→%v; node LocalVolume reconciles %v→%v",
		ctrlBefore[okKey], ctrlAfter[okKey], ctrlBefore[exhaustedKey], ctrlAfter[exhaustedKey], nodeBefore[allocKey], nodeAfter[allocKey],
		nodeBefore[reconciledKey], nodeAfter[reconciledKey])
}
