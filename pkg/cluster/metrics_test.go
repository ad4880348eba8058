package cluster

import (
	"context"
	"net/url"
	"testing"
	"time"

	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"

	// As in the node plugin: controller-runtime's controller package
	// registers its own Go and process collectors and the work queue
	// metrics provider.
	_ "sigs.k8s.io/controller-runtime/pkg/controller"

	"github.com/localdir-csi/localdir/pkg/metrics"
)

// metrics.Gatherer serves localdir's series and controller-runtime's work queue
// series once each: a series in both registries (the Go and process
// collectors are) fails the whole scrape, as the first version of it did.
func TestGathererServesEachSeriesOnce(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "localvolume"})
	defer q.ShutDown()
	q.Add("vol-1")
	item, _ := q.Get()
	q.Done(item)
	metrics.ObserveRPC("Probe", "OK", time.Millisecond)
	// What client-go reports for each API request, as the node plugin's
	// client does.
	u, _ := url.Parse("https://127.0.0.1:6443/apis")
	clientmetrics.RequestLatency.Observe(context.Background(), "GET", *u, 10*time.Millisecond)
	clientmetrics.RateLimiterLatency.Observe(context.Background(), "GET", *u, time.Millisecond)
	clientmetrics.RequestResult.Increment(context.Background(), "200", "GET", "127.0.0.1:6443")

	fams, err := metrics.Gatherer.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	seen := map[string]int{}
	for _, f := range fams {
		seen[f.GetName()]++
	}
	for _, name := range []string{"localdir_rpc_requests_total", "go_goroutines", "process_cpu_seconds_total",
		"workqueue_adds_total", "workqueue_queue_duration_seconds",
		"rest_client_requests_total", "rest_client_request_duration_seconds", "rest_client_rate_limiter_duration_seconds"} {
		if seen[name] != 1 {
			t.Errorf("%s served %d times, want once", name, seen[name])
		}
	}
}
