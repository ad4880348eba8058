package cluster

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/localdir-csi/localdir/pkg/metrics"
)

// In controller and node modes /metrics also serves, from controller-runtime's
// registry, the node agent's reconcile and work queue series
// (controller_runtime_reconcile_total and _time_seconds, workqueue_depth,
// workqueue_queue_duration_seconds…, labelled controller="localvolume",
// "localsnapshot" or "localgroupsnapshot") and its API client's
// (rest_client_requests_total, rest_client_request_duration_seconds,
// rest_client_rate_limiter_duration_seconds): how long a volume waited for a
// worker of the node plugin, and how the API server answered it. They are
// added here, not in pkg/metrics, so that all mode and the packages it is
// made of do not depend on client-go.
func init() {
	// Opt-in in controller-runtime: how long API requests took, and how
	// long each waited for the client's own rate limiter (client-side
	// throttling; --kube-api-qps, --kube-api-burst).
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRequestLatency, ctrlmetrics.MetricRateLimiterLatency)
	metrics.AddGatherer(prometheus.GathererFunc(controllerRuntimeFamilies))
}

// controllerRuntimeFamilies gathers controller-runtime's registry, keeping
// the families named above. The rest of it (its own Go and process
// collectors) would repeat metrics.Registry's series, which fails the whole
// scrape.
func controllerRuntimeFamilies() ([]*dto.MetricFamily, error) {
	fams, err := ctrlmetrics.Registry.Gather()
	kept := fams[:0]
	for _, f := range fams {
		for _, p := range []string{"controller_runtime_", "workqueue_", "rest_client_"} {
			if strings.HasPrefix(f.GetName(), p) {
				kept = append(kept, f)
				break
			}
		}
	}
	return kept, err
}
