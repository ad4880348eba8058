package app

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// The files of --metrics-cert-dir: the key names of a kubernetes.io/tls
// Secret (what cert-manager writes).
const (
	metricsCertFile = "tls.crt"
	metricsKeyFile  = "tls.key"
)

// MetricsServer serves metrics.Gatherer at /metrics: in controller and node
// mode over HTTPS to bearer tokens the API server authenticates and allows get
// on /metrics (controller-runtime's filters, as kubebuilder projects do); in
// all mode, without an API server, plain HTTP on loopback only.
type MetricsServer struct {
	addr    string
	certDir string                   // "" in all mode, or for a self-signed certificate
	watcher *certwatcher.CertWatcher // the certificate of certDir, reloaded when it changes
	tls     *tls.Config              // nil: plain HTTP
	filter  metricsserver.Filter     // nil in all mode
}

// NewMetricsServer prepares /metrics for opts (nil when opts.MetricsAddress
// is empty); cfg is the API server tokens are checked with, nil in all mode.
// Everything wrong with the flags fails here, before the process starts.
func NewMetricsServer(opts driver.Options, cfg *rest.Config) (*MetricsServer, error) {
	if opts.MetricsAddress == "" {
		return nil, nil
	}
	s := &MetricsServer{addr: opts.MetricsAddress}
	if cfg == nil {
		return s, nil
	}
	s.certDir = opts.MetricsCertDir
	// HTTP/1.1 only, as kubebuilder's scaffold has it: HTTP/2's streams (the
	// rapid-reset attacks of 2023) buy a scraper nothing.
	s.tls = &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	if s.certDir != "" {
		// certwatcher.New reads the pair once here, so a missing or bad one
		// fails the start.
		w, err := certwatcher.New(filepath.Join(s.certDir, metricsCertFile), filepath.Join(s.certDir, metricsKeyFile))
		if err != nil {
			return nil, fmt.Errorf("--metrics-cert-dir=%q: want a certificate %s and its key %s: %w", s.certDir, metricsCertFile, metricsKeyFile, err)
		}
		s.watcher = w
		s.tls.GetCertificate = w.GetCertificate
	} else {
		// Encryption without a name anyone can check, as controller-runtime's
		// metrics server does by default; --metrics-cert-dir gives a real one.
		crt, key, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, nil)
		if err != nil {
			return nil, fmt.Errorf("self-signed certificate for /metrics: %w", err)
		}
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			return nil, fmt.Errorf("self-signed certificate for /metrics: %w", err)
		}
		s.tls.Certificates = []tls.Certificate{pair}
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("/metrics authentication: %w", err)
	}
	if s.filter, err = filters.WithAuthenticationAndAuthorization(cfg, hc); err != nil {
		return nil, fmt.Errorf("/metrics authentication: %w", err)
	}
	return s, nil
}

// Serve listens on the address and serves until ctx is done; with
// --metrics-cert-dir it reloads the certificate when its files change.
func (s *MetricsServer) Serve(ctx context.Context) error {
	h := metrics.Handler()
	if s.filter != nil {
		var err error
		if h, err = s.filter(klog.Background().WithName("metrics"), h); err != nil {
			return fmt.Errorf("/metrics authentication: %w", err)
		}
	}
	lis, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("--metrics-address: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	if s.tls != nil {
		if s.watcher != nil {
			g.Go(func() error {
				if err := s.watcher.Start(gctx); err != nil {
					return fmt.Errorf("--metrics-cert-dir=%q: watch for new certificates: %w", s.certDir, err)
				}
				return nil
			})
		}
		lis = tls.NewListener(lis, s.tls)
	}
	klog.InfoS("Serving metrics", "address", lis.Addr().String(), "https", s.tls != nil, "certDir", s.certDir)
	g.Go(func() error { return metrics.Serve(gctx, lis, h) })
	return g.Wait()
}

// serveMetrics runs s (when there is one) in g, with state's gauges.
func serveMetrics(ctx context.Context, g *errgroup.Group, s *MetricsServer, state metrics.StateFunc) error {
	if s == nil {
		return nil
	}
	if err := metrics.RegisterState(state); err != nil {
		return err
	}
	g.Go(func() error { return s.Serve(ctx) })
	return nil
}
