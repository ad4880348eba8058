//go:build tools

// Package tools pins the Kubernetes binaries the cluster tests build from
// the k8s.io/kubernetes module (see Makefile target `tools`). Nothing here is
// part of the driver.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
