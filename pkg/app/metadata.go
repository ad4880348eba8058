package app

import (
	"context"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/transfer"
)

// Namespace is opts.Namespace, else the pod's ServiceAccount namespace,
// else "" (outside a pod).
func Namespace(opts driver.Options) string {
	if opts.Namespace != "" {
		return opts.Namespace
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(ns))
}

// ServeControllerRanges lets controller backend b serve the SnapshotMetadata
// service: a key of its own for the node-to-node channel, whose certificate
// it publishes under replica in the driver's namespace (cluster.
// PublishControllerCert) before b asks any node, and again whenever the key
// is renewed, until ctx ends (the returned func runs that loop). Without a
// namespace the service is not served (nil func).
func ServeControllerRanges(ctx context.Context, opts driver.Options, cfg *rest.Config, b *cluster.ControllerBackend, replica string) (func() error, error) {
	ns := Namespace(opts)
	if ns == "" {
		klog.InfoS("No namespace (--namespace, or a pod's ServiceAccount): the SnapshotMetadata service is not served")
		return nil, nil
	}
	id, err := transfer.NewIdentity("controller", opts.TransferCertLifetime)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return nil, err
	}
	expired := func(pem string) bool {
		cert, err := transfer.Pinned(pem)
		return err != nil || time.Now().After(cert.NotAfter)
	}
	publish := func() error {
		return cluster.PublishControllerCert(ctx, c, ns, replica, id.CertificatePEM(), expired)
	}
	if err := publish(); err != nil {
		return nil, err
	}
	b.Ranges = &transfer.Client{Identity: id}
	return func() error {
		t := time.NewTicker(min(opts.TransferCertLifetime/8, time.Hour))
		defer t.Stop()
		published := id.CertificatePEM()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			if err := id.RotateIfOld(); err != nil {
				klog.ErrorS(err, "Renewing the controller's channel key failed; the current one is kept")
			}
			if pem := id.CertificatePEM(); pem != published {
				if err := publish(); err != nil {
					klog.ErrorS(err, "Publishing the controller's channel certificate failed; retried at the next tick")
					continue
				}
				published = pem
			}
		}
	}, nil
}

// SnapshotMetadataCertLifetime is the validity of the certificate the
// controller makes for the external-snapshot-metadata sidecar (renewed with
// a third of it left).
const SnapshotMetadataCertLifetime = 365 * 24 * time.Hour

// PublishSnapshotMetadata keeps, with --snapshot-metadata-address, the
// SnapshotMetadataService and the sidecar's TLS Secret (cluster.
// SnapshotMetadataEndpoint), checked every hour until ctx ends; nil func
// without the flag or a namespace.
func PublishSnapshotMetadata(opts driver.Options, cfg *rest.Config) (func(ctx context.Context), error) {
	ns := Namespace(opts)
	if opts.SnapshotMetadataAddress == "" || ns == "" {
		return nil, nil
	}
	c, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return nil, err
	}
	audience := opts.SnapshotMetadataAudience
	if audience == "" {
		audience = opts.DriverName
	}
	e := cluster.SnapshotMetadataEndpoint{
		Driver: opts.DriverName, Namespace: ns, Secret: opts.SnapshotMetadataSecret,
		Address: opts.SnapshotMetadataAddress, Audience: audience, Lifetime: SnapshotMetadataCertLifetime,
		CertDir: opts.SnapshotMetadataCertDir,
	}
	return func(ctx context.Context) { e.Run(ctx, c, time.Hour) }, nil
}
