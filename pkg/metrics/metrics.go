// Package metrics defines localdir's Prometheus metrics (localdir_ prefix,
// base units, _total counters) and serves them for pkg/app.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/klog/v2"
)

// Registry holds every localdir metric (and the Go/process collectors).
var Registry = prometheus.NewRegistry()

var (
	// RPCs counts finished CSI calls by method and gRPC code ("OK" for
	// success): errors by code are the series with code != "OK".
	RPCs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "localdir_rpc_requests_total",
		Help: "CSI RPCs served, by method and gRPC status code.",
	}, []string{"method", "code"})
	// RPCDuration is the latency of CSI calls in seconds, by method.
	RPCDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "localdir_rpc_duration_seconds",
		Help:    "Latency of CSI RPCs in seconds, by method.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"method"})
	// ReconcileErrors counts failed reconciles of the node plugin, by kind
	// (LocalVolume, LocalSnapshot, LocalNode).
	ReconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "localdir_node_reconcile_errors_total",
		Help: "Reconciles of the node plugin that failed, by object kind.",
	}, []string{"kind"})
)

func init() {
	Registry.MustRegister(RPCs, RPCDuration, ReconcileErrors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// ObserveRPC records one finished RPC.
func ObserveRPC(method, code string, d time.Duration) {
	RPCs.WithLabelValues(method, code).Inc()
	RPCDuration.WithLabelValues(method).Observe(d.Seconds())
}

// Gauge descriptions of the state collectors (see StateFunc).
var (
	CapacityDesc = prometheus.NewDesc("localdir_capacity_bytes",
		"Capacity of the node's data root in bytes (--capacity, or its filesystem size).", []string{"node"}, nil)
	AllocatableDesc = prometheus.NewDesc("localdir_allocatable_bytes",
		"Bytes new volumes may still reserve on the node: min(capacity - sum of volume sizes, free - what those volumes may still write).", []string{"node"}, nil)
	AllocatedDesc = prometheus.NewDesc("localdir_allocated_bytes",
		"Sum of the sizes of the node's volumes in bytes.", []string{"node"}, nil)
	FreeDesc = prometheus.NewDesc("localdir_free_bytes",
		"Free space of the data root's filesystem in bytes.", []string{"node"}, nil)
	VolumesDesc = prometheus.NewDesc("localdir_volumes",
		"Volumes by phase (node and all mode: the node's records; controller mode: LocalVolume objects).", []string{"node", "phase"}, nil)
	SnapshotsDesc = prometheus.NewDesc("localdir_snapshots",
		"Snapshots by phase.", []string{"node", "phase"}, nil)
	LoopDevicesDesc = prometheus.NewDesc("localdir_loop_devices_attached",
		"Loop devices attached to the node's block volume images.", []string{"node"}, nil)
	OrphansDesc = prometheus.NewDesc("localdir_orphaned_data",
		"Volumes and snapshots on the node that no LocalVolume/LocalSnapshot claims (kept, never deleted on their own).", []string{"node"}, nil)
	LeftoversDesc = prometheus.NewDesc("localdir_recovery_leftovers",
		"Data that start-up recovery found and could not put in order (kept in place; the driver serves everything else; listed in the log and LocalNode status.recoveryProblems).", []string{"node"}, nil)
)

// Sample is one value of a state gauge.
type Sample struct {
	Desc   *prometheus.Desc
	Value  float64
	Labels []string
}

// StateFunc reads the current state at scrape time.
type StateFunc func() []Sample

type stateCollector struct{ f StateFunc }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{CapacityDesc, AllocatableDesc, AllocatedDesc, FreeDesc, VolumesDesc, SnapshotsDesc, LoopDevicesDesc, OrphansDesc, LeftoversDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.f() {
		m, err := prometheus.NewConstMetric(s.Desc, prometheus.GaugeValue, s.Value, s.Labels...)
		if err != nil {
			klog.ErrorS(err, "Bad metric sample")
			continue
		}
		ch <- m
	}
}

var (
	stateMu sync.Mutex
	state   *stateCollector
)

// RegisterState makes f the state collector called at every scrape,
// replacing an earlier one (a process serves one data root or one cluster).
func RegisterState(f StateFunc) error {
	stateMu.Lock()
	defer stateMu.Unlock()
	if state != nil {
		Registry.Unregister(state)
	}
	state = &stateCollector{f}
	return Registry.Register(state)
}

// Gatherer is what /metrics serves: Registry, then what each AddGatherer
// added (cluster mode: controller-runtime's series).
var Gatherer prometheus.Gatherer = prometheus.GathererFunc(gather)

var (
	addedMu sync.Mutex
	added   []prometheus.Gatherer
)

// AddGatherer makes /metrics serve g's families too, after Registry's; g must
// leave out the Go and process collectors, or the whole scrape fails.
func AddGatherer(g prometheus.Gatherer) {
	addedMu.Lock()
	defer addedMu.Unlock()
	added = append(added, g)
}

func gather() ([]*dto.MetricFamily, error) {
	addedMu.Lock()
	gs := append(prometheus.Gatherers{Registry}, added...)
	addedMu.Unlock()
	return gs.Gather()
}

// Handler serves Gatherer in the Prometheus exposition formats.
func Handler() http.Handler {
	return promhttp.HandlerFor(Gatherer, promhttp.HandlerOpts{Registry: Registry})
}

// Serve serves h at /metrics on lis until ctx is done, then closes lis.
// The caller picks the transport (plain TCP or TLS) and what guards h.
func Serve(ctx context.Context, lis net.Listener, h http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
