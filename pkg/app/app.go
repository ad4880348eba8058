// Package app wires a localdir process for its mode: the CSI gRPC server,
// and in cluster modes the API-server side (controller backend or node
// agent). cmd/localdir-csi only parses flags and handles signals.
package app

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/pkg/driver"
)

// RestConfig loads the kubeconfig file, or the in-cluster configuration
// when the path is empty.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not running in a cluster: %w", err)
		}
		return cfg, nil
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// Run runs the process for opts.Mode until ctx is done.
func Run(ctx context.Context, opts driver.Options) error {
	if err := opts.Validate(); err != nil {
		return err
	}
	switch opts.Mode {
	case driver.ModeAll:
		d, err := driver.New(opts)
		if err != nil {
			return err
		}
		return d.Run(ctx)
	case driver.ModeController:
		cfg, err := RestConfig(opts.Kubeconfig)
		if err != nil {
			return err
		}
		cfg.QPS, cfg.Burst = 100, 200
		b, err := cluster.NewControllerBackend(cfg, opts.MaxVolumeBytes)
		if err != nil {
			return err
		}
		d, err := driver.NewController(opts, b)
		if err != nil {
			return err
		}
		return d.Run(ctx)
	}
	cfg, err := RestConfig(opts.Kubeconfig)
	if err != nil {
		return err
	}
	d, err := driver.New(opts)
	if err != nil {
		return err
	}
	agent := &cluster.NodeAgent{NodeID: opts.NodeID, VM: d.VolumeManager(), Version: driver.Version(), MaxVolumeBytes: opts.MaxVolumeBytes}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return agent.Start(gctx, cfg) })
	// The gRPC server stops when the agent fails, and the other way round.
	g.Go(func() error { return d.Run(gctx) })
	return g.Wait()
}
