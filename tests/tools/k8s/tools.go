//go:build tools

// Package tools pins what the tests run next to localdir, all built from
// this one module (Makefile targets `tools` and `e2e-tools`): the Kubernetes
// binaries from k8s.io/kubernetes, controller-gen (make generate), the CSI sidecars and snapshot-controller
// of the end-to-end cluster (tests/e2e), helm, and etcd (./etcd). One module
// gives them one version of every dependency they share (client-go, grpc,
// otel, the etcd client…), so a cold build compiles each of those once. The
// sidecars' own go.mod files carry replace directives, so `go install
// …@version` fails for them. Nothing here is part of the driver.
package tools

import (
	_ "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher"
	_ "github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner"
	_ "github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer"
	_ "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
	_ "github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
