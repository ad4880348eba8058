// Package cluster carries localdir to a Kubernetes cluster. The controller
// Deployment records intent in LocalVolume / LocalSnapshot custom resources
// (ControllerBackend, the Backend of the CSI Controller service: backend.go,
// with placement.go choosing nodes and wait.go waiting for them), and every
// node plugin carries out the ones of its own node with the same pkg/volume
// code that all mode calls (NodeAgent, which runs LocalVolumeReconciler,
// LocalSnapshotReconciler and the LocalNode heartbeat).
package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
)

// Scheme knows the localdir types.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// VolumeIDFor is the volume_id the controller gives the volume of a CSI
// name: deterministic, so a retried CreateVolume finds the object its first
// attempt created, and of the driver's id shape (vol- + 32 hex digits).
func VolumeIDFor(name string) string {
	h := sha256.Sum256([]byte("volume\x00" + name))
	return "vol-" + hex.EncodeToString(h[:16])
}

// SnapshotIDFor is VolumeIDFor for snapshots (snap- + 32 hex digits).
func SnapshotIDFor(name string) string {
	h := sha256.Sum256([]byte("snapshot\x00" + name))
	return "snap-" + hex.EncodeToString(h[:16])
}

// StaleAfter is how old a LocalNode heartbeat may be before the controller
// treats the node plugin as gone (no capacity, no placement), by default
// (--node-stale-after; ControllerBackend.StaleAfter).
const StaleAfter = 3 * time.Minute
