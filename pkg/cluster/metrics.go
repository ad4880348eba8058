package cluster

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/localdir-csi/localdir/pkg/metrics"
)

// In controller and node modes /metrics also serves controller-runtime's
// reconcile and work queue series (controller="localvolume", "localsnapshot",
// "localgroupsnapshot") and its API client's rest_client_* series. They are
// added here, not in pkg/metrics, so that all mode does not depend on client-go.
func init() {
	// Opt-in in controller-runtime: API request latency and client-side
	// rate limiter waits (--kube-api-qps, --kube-api-burst).
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRequestLatency, ctrlmetrics.MetricRateLimiterLatency)
	metrics.AddGatherer(prometheus.GathererFunc(controllerRuntimeFamilies))
}

// controllerRuntimeFamilies gathers the families named above from
// controller-runtime's registry; its Go and process collectors would repeat
// metrics.Registry's series, which fails the whole scrape.
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
