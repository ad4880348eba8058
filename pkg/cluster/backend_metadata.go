package cluster

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Changed block tracking in cluster mode: the controller serves the CSI
// SnapshotMetadata service, but a snapshot's extents are on the nodes that
// hold it. The controller asks one of them over the node-to-node channel,
// authenticated by a certificate of its own that it publishes in the
// ConfigMap ControllerCertsConfigMap (one key per controller replica);
// node plugins serve the ranges only to a client presenting one of those.

// ControllerCertsConfigMap names the ConfigMap, in the driver's namespace,
// holding each controller replica's certificate (PEM) under its name.
const ControllerCertsConfigMap = "localdir-controller-certificates"

// RangesClient asks a node plugin for a snapshot's block ranges
// (pkg/transfer Client.Ranges, with the controller's identity).
type RangesClient interface {
	Ranges(ctx context.Context, node, address, certPEM, target, base string, start int64, yield func(off, n int64) error) error
}

// ServesMetadata implements driver.MetadataBackend: with a RangesClient.
func (b *ControllerBackend) ServesMetadata() bool { return b.Ranges != nil }

// SnapshotRanges implements driver.MetadataBackend: the ranges from a node
// holding snapshot targetID (and baseID, when given), fresh and serving the
// node-to-node channel. Errors: contract.ErrNotFound, contract.ErrPrecondition
// (no such node is up: snapshots of one volume on different nodes, or its
// node gone), the node's own (contract.Reported).
func (b *ControllerBackend) SnapshotRanges(ctx context.Context, baseID, targetID string, start int64, yield func(off, n int64) error) error {
	target, err := b.Snapshot(ctx, targetID)
	if err != nil {
		return err
	}
	nodes := target.Nodes
	if len(nodes) == 0 {
		nodes = []string{target.Node}
	}
	if baseID != "" {
		base, err := b.Snapshot(ctx, baseID)
		if err != nil {
			return err
		}
		baseNodes := base.Nodes
		if len(baseNodes) == 0 {
			baseNodes = []string{base.Node}
		}
		nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return !slices.Contains(baseNodes, n) })
		if len(nodes) == 0 {
			return fmt.Errorf("%w: snapshots %s (on %v) and %s (on %v) are on no node together: no delta can be given",
				contract.ErrPrecondition, baseID, baseNodes, targetID, target.Nodes)
		}
	}
	var why []string
	for _, n := range nodes {
		ln, ok := get[*v1.LocalNode](b.cache.nodes, n)
		switch {
		case !ok:
			why = append(why, n+": no LocalNode")
		case time.Since(ln.Status.Heartbeat.Time) > b.StaleAfter:
			why = append(why, n+": its node plugin has not reported since "+ln.Status.Heartbeat.Format(time.RFC3339))
		case ln.Status.Transfer == nil:
			why = append(why, n+": its node plugin serves no node-to-node channel")
		default:
			return b.Ranges.Ranges(ctx, n, ln.Status.Transfer.Address, ln.Status.Transfer.Certificate, targetID, baseID, start, yield)
		}
	}
	return fmt.Errorf("%w: no node holding snapshot %s can answer now (%v)", contract.ErrPrecondition, targetID, why)
}

// PublishControllerCert records certPEM under replica in namespace's
// ControllerCertsConfigMap (deploy/ ships it empty: the controller may not
// create ConfigMaps), dropping the entries whose certificate has expired
// (replicas gone), per expired.
func PublishControllerCert(ctx context.Context, c client.Client, namespace, replica, certPEM string, expired func(pem string) bool) error {
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ControllerCertsConfigMap}, cm); err != nil {
		return fmt.Errorf("read ConfigMap %s/%s (deploy/ makes it): %w", namespace, ControllerCertsConfigMap, err)
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	for k, v := range cm.Data {
		if k != replica && expired(v) {
			klog.InfoS("Dropping an expired controller certificate", "replica", k)
			delete(cm.Data, k)
		}
	}
	cm.Data[replica] = certPEM
	return c.Update(ctx, cm)
}

// ControllerCerts reads the certificates the controller replicas published
// (uncached: a node plugin reads it only when the controller asks).
func ControllerCerts(reader client.Reader, namespace string) func(ctx context.Context) ([]string, error) {
	return func(ctx context.Context) ([]string, error) {
		cm := &corev1.ConfigMap{}
		if err := reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ControllerCertsConfigMap}, cm); err != nil {
			return nil, err
		}
		out := make([]string, 0, len(cm.Data))
		for _, v := range cm.Data {
			out = append(out, v)
		}
		return out, nil
	}
}
