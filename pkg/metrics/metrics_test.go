package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Gatherer serves Registry's families and those of each AddGatherer, and a
// family served by both fails the scrape (why cluster mode's gatherer
// leaves out controller-runtime's Go and process collectors).
func TestGathererAddsGatherers(t *testing.T) {
	addedMu.Lock()
	before := added
	addedMu.Unlock()
	t.Cleanup(func() {
		addedMu.Lock()
		added = before
		addedMu.Unlock()
	})
	ObserveRPC("Probe", "OK", time.Millisecond)
	extra := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_extra_total", Help: "a family of an added gatherer"})
	c.Inc()
	extra.MustRegister(c)
	AddGatherer(extra)

	fams, err := Gatherer.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	seen := map[string]int{}
	for _, f := range fams {
		seen[f.GetName()]++
	}
	for _, name := range []string{"localdir_rpc_requests_total", "go_goroutines", "process_cpu_seconds_total", "test_extra_total"} {
		if seen[name] != 1 {
			t.Errorf("%s served %d times, want once", name, seen[name])
		}
	}

	dup := prometheus.NewRegistry()
	dup.MustRegister(collectors.NewGoCollector())
	AddGatherer(dup)
	if _, err := Gatherer.Gather(); err == nil {
		t.Error("gather with go_goroutines in two gatherers: no error, want one")
	}
}
