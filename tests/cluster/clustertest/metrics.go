package clustertest

import (
	"context"
	"testing"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// withMetrics returns serve, plus, when o.MetricsAddress is set, the
// /metrics server app.Run gives that mode (pkg/app's MetricsServer: HTTPS,
// every scrape's token checked with the API server as cfg), with state's
// gauges; both stop when either fails.
func withMetrics(t testing.TB, o driver.Options, cfg *rest.Config, state metrics.StateFunc, serve func(context.Context) error) func(context.Context) error {
	t.Helper()
	ms, err := app.NewMetricsServer(o, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ms == nil {
		return serve
	}
	if err := metrics.RegisterState(state); err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return ms.Serve(gctx) })
		g.Go(func() error { return serve(gctx) })
		return g.Wait()
	}
}
