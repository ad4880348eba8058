//go:build tools

// Package tools pins the CSI sidecars and the snapshot-controller that the
// end-to-end cluster (tests/e2e) runs next to localdir. They are built
// together here because their own go.mod files carry replace directives,
// so `go install …@version` fails (see Makefile target `e2e-tools`).
// Nothing here is part of the driver.
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	_ "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)
