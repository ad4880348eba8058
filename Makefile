# localdir — make help lists the targets.
SHELL := /bin/bash
GO ?= go
OUT := $(CURDIR)/_output
BIN := $(OUT)/localdir-csi
CSI_TEST_VERSION := v5.6.0
CSI_SANITY := $(OUT)/bin/csi-sanity
GOTEST_FLAGS ?= -count=1

TOOLS := $(OUT)/tools/bin
CONTROLLER_GEN := $(OUT)/bin/controller-gen
CONTROLLER_TOOLS_VERSION := v0.23.0
K8S_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=v1.37.2 -X $(p).gitMajor=1 -X $(p).gitMinor=37)

.PHONY: help build test unit sanity test-cluster tools generate bench demo verify clean static image

help: ## show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

build: ## build the driver binary into _output/
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/localdir-csi

test: verify tools ## everything: unit, case, csi-sanity and cluster tests (as root: real mounts)
	$(GO) test $(GOTEST_FLAGS) -race ./...

unit: ## unit tests only (no root needed)
	$(GO) test $(GOTEST_FLAGS) ./pkg/...

sanity: ## csi-sanity (csi-test/v5) in all mode, in-process: dir, XFS reflink, btrfs, block
	$(GO) test $(GOTEST_FLAGS) -v ./tests/sanity/...

test-cluster: tools ## cluster-mode tests against a real etcd + kube-apiserver (part of make test)
	$(GO) test $(GOTEST_FLAGS) -v ./tests/cluster/...

# The control plane for the cluster tests, built from Go modules in their own
# modules under tests/tools (cached in _output/tools/bin; ~7 min cold).
tools: $(TOOLS)/etcd $(TOOLS)/kube-apiserver $(TOOLS)/kubectl $(TOOLS)/kustomize $(TOOLS)/helm

$(TOOLS)/etcd: tests/tools/etcd/go.mod tests/tools/etcd/main.go
	cd tests/tools/etcd && $(GO) build -o $@ .

$(TOOLS)/kube-apiserver $(TOOLS)/kubectl: tests/tools/k8s/go.mod
	cd tests/tools/k8s && $(GO) build -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/$(notdir $@)

# kustomize and helm render deploy/ in tests/cluster/deploy.
$(TOOLS)/kustomize: tests/tools/kustomize/go.mod
	cd tests/tools/kustomize && $(GO) build -o $@ sigs.k8s.io/kustomize/kustomize/v5

# helm's version and default Kubernetes version (for kubeVersion checks)
# are stamped as its own Makefile does, from tests/tools/helm/go.mod.
$(TOOLS)/helm: tests/tools/helm/go.mod
	cd tests/tools/helm && v=$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v3) && \
	  minor=$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2) && \
	  $(GO) build -ldflags "-X helm.sh/helm/v3/internal/version.version=$$v $(foreach p,pkg/lint/rules pkg/chartutil,-X helm.sh/helm/v3/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/$(p).k8sVersionMinor=$$minor)" -o $@ helm.sh/helm/v3/cmd/helm

$(CONTROLLER_GEN):
	GOBIN=$(OUT)/bin $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)

generate: $(CONTROLLER_GEN) ## regenerate deepcopy code and the CRDs in deploy/
	$(CONTROLLER_GEN) object paths=./pkg/cluster/api/... crd:crdVersions=v1 output:crd:artifacts:config=deploy/kubernetes/crds

bench: ## benchmarks: CO-like client over the driver's socket (as root)
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./tests/bench/

$(CSI_SANITY):
	GOBIN=$(OUT)/bin $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_TEST_VERSION)

demo: build $(CSI_SANITY) ## the main job: run the driver in all mode and csi-sanity against it
	@bash tests/demo/demo.sh "$(BIN)" "$(CSI_SANITY)"

verify: ## gofmt and go vet
	@test -z "$$(gofmt -l cmd pkg tests)" || { echo "gofmt needed:"; gofmt -l cmd pkg tests; exit 1; }
	$(GO) vet ./...

# The image's version comes from one place: the driver image tag in
# deploy/kubernetes/kustomization.yaml (which deploy/helm/localdir/values.yaml
# mirrors, checked by tests/cluster/deploy).
IMAGE ?= localdir/localdir-csi
IMAGE_TAG ?= $(shell awk '/name: localdir\/localdir-csi/{getline; print $$2}' deploy/kubernetes/kustomization.yaml)

static: ## the image's static binary (same build command as the Dockerfile) into _output/static/
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "-s -w -X github.com/localdir-csi/localdir/pkg/driver.version=$(IMAGE_TAG)" -o $(OUT)/static/localdir-csi ./cmd/localdir-csi

image: ## build the container image (needs a Docker engine; none runs on the CI machine)
	docker build --build-arg VERSION=$(IMAGE_TAG) -t $(IMAGE):$(IMAGE_TAG) .

clean: ## remove build output
	rm -rf $(OUT)
