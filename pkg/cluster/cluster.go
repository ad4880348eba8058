// Package cluster carries localdir to a Kubernetes cluster: the controller
// records intent in LocalVolume / LocalSnapshot custom resources
// (ControllerBackend), and every node plugin carries out those of its node
// with the pkg/volume code all mode uses (NodeAgent).
package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// Scheme knows the localdir types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := corev1.AddToScheme(s); err != nil { // the controller's certificates (ConfigMap)
		panic(err)
	}
	return s
}

// VolumeIDFor is the volume_id of the volume of a CSI name: deterministic, so
// a retried CreateVolume finds its first attempt's object.
func VolumeIDFor(name string) string {
	h := sha256.Sum256([]byte("volume\x00" + name))
	return "vol-" + hex.EncodeToString(h[:16])
}

// SnapshotIDFor is VolumeIDFor for snapshots (snap- + 32 hex digits).
func SnapshotIDFor(name string) string {
	h := sha256.Sum256([]byte("snapshot\x00" + name))
	return "snap-" + hex.EncodeToString(h[:16])
}

// StaleAfter is the default of --node-stale-after: how old a LocalNode
// heartbeat may be before the node counts as gone.
const StaleAfter = 3 * time.Minute
