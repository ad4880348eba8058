//go:build tools

// Package tools pins kustomize, which the deploy tests use to render
// deploy/kubernetes (see Makefile target `tools`). Nothing here is part of
// the driver.
package tools

import _ "sigs.k8s.io/kustomize/kustomize/v5"
