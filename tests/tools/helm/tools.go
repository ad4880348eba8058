//go:build tools

// Package tools pins helm, which the deploy tests use to render and lint
// deploy/helm/localdir (see Makefile target `tools`). Nothing here is part
// of the driver.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
