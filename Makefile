# localdir — make help lists the targets.
SHELL := /bin/bash
GO ?= go
OUT := $(CURDIR)/_output
BIN := $(OUT)/localdir-csi
CSI_TEST_VERSION := v5.6.0
CSI_SANITY := $(OUT)/bin/csi-sanity
GOTEST_FLAGS ?= -count=1

TOOLS := $(OUT)/tools/bin
CONTROLLER_GEN := $(TOOLS)/controller-gen
# Everything of this module built or tested without -race (make build, vet,
# unit, unit-nobody, e2e, the harness binaries, the tests' driver binaries)
# uses the image's build configuration (the Dockerfile's command, which make
# static spells out), CGO off and -trimpath: one compile of
# the dependencies serves them all, and as -trimpath keeps the module cache's
# location out of the build cache's keys, unit-nobody reuses root's entries.
# Only -race (make test) needs cgo. The tools of tests/tools/k8s are built
# the same way (Kubernetes builds its control plane and kubectl without cgo,
# and kubelet too from v1.38 on), and that module keeps the versions of what
# this module compiles (client-go, grpc, prometheus…), so the tools reuse
# this module's compiled dependencies.
NOCGO := CGO_ENABLED=0
TRIM := -trimpath
# The tools are linked without symbol table and DWARF (nobody debugs them
# here): a link of kube-apiserver takes 10 s instead of 14.
STRIP := -s -w

K8S_LDFLAGS := $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=v1.37.2 -X $(p).gitMajor=1 -X $(p).gitMinor=37)

.PHONY: deps help build test unit unit-nobody verify-generated sanity test-cluster tools generate bench bench-cluster demo verify clean static image image-oci e2e e2e-tools demo-sanity demo-down e2e-k8s

help: ## show this help
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

build: ## build the driver binary into _output/
	$(NOCGO) $(GO) build $(TRIM) -buildvcs=auto -o $(BIN) ./cmd/localdir-csi

deps: ## install the Debian packages the tests and the demo need (as root; no-op when present)
	@bash .ci/install-deps

# The longest-running test packages are named first, so go test builds and
# starts them first and the rest run beside them instead of after them.
LONG_TEST_PKGS := ./tests/reliability/ ./tests/cluster/datasafety/ ./tests/cluster/multinode/
test: deps verify tools ## everything: unit, case, csi-sanity and cluster tests (as root: real mounts)
	$(GO) test $(GOTEST_FLAGS) -race -timeout 30m $(LONG_TEST_PKGS) ./...
	$(MAKE) fuzz

# Packages whose tests need root (real mounts, loop devices, btrfs, chown,
# mknod, cgroups) or a network (pkg/transfer: real TLS over 127.0.0.1):
# they fail, never skip, without it, so make unit leaves them out and
# make test (as root) runs them. Naming a package that no longer exists makes
# make unit fail rather than quietly run more or less than it says.
ROOT_ONLY_PKGS := ./pkg/volume/engine ./pkg/publish/loop ./pkg/publish/cgroup ./pkg/transfer ./pkg/volume/fscrypt

# UNPRIVILEGED_PKGS are the tests outside pkg/ that make unit runs too:
# csi-sanity over mount.Fake and the dir engine on a temporary directory.
UNPRIVILEGED_PKGS := ./tests/sanity/unprivileged

unit: ## unit tests: pkg/ minus ROOT_ONLY_PKGS, and csi-sanity over mount.Fake; need neither root nor network
	@pkgs=$$($(GO) list ./pkg/...) && skip=$$($(GO) list $(ROOT_ONLY_PKGS)) && \
	  $(NOCGO) $(GO) test $(TRIM) $(GOTEST_FLAGS) $$(grep -vxF "$$skip" <<<"$$pkgs") $(UNPRIVILEGED_PKGS)

# make unit as user nobody with no network (a new network namespace holding
# only a down loopback, and GOPROXY=off), as CI runs it:
# root's module cache is under $$HOME (not readable by nobody), so the modules
# the tests need are copied, from that cache (or the proxy when missing), into
# a world-readable one under UNIT_NOBODY_DIR, which also keeps nobody's build
# cache between runs. That cache first gets hard links to root's build cache
# entries (the NOCGO/TRIM configuration makes them the same compiles), so
# nobody does not compile the dependencies again: the links stay root's files,
# which nobody can read but not change; only the directories are nobody's, so
# it can add entries. Run as root.
UNIT_NOBODY_DIR ?= /var/tmp/localdir-unit-nobody
unit-nobody: ## make unit as user nobody without network (as root; what CI runs)
	@set -e; d=$(UNIT_NOBODY_DIR); install -d -m 0755 $$d $$d/mod; install -d -o 65534 -g 65534 $$d/home $$d/home/cache; \
	  c=$$($(GO) env GOCACHE); if ls -d "$$c"/[0-9a-f][0-9a-f] >/dev/null 2>&1; then \
	    cp -al "$$c"/[0-9a-f][0-9a-f] $$d/home/cache/ 2>/dev/null || echo "unit-nobody: some of root's build cache could not be linked (another filesystem?); nobody compiles the rest"; \
	    find $$d/home/cache -maxdepth 1 -type d -user 0 -exec chown 65534:65534 {} +; fi; \
	  GOMODCACHE=$$d/mod GOPROXY="file://$$($(GO) env GOMODCACHE)/cache/download,$$($(GO) env GOPROXY)" GOFLAGS=-mod=readonly $(GO) mod download; \
	  unshare --net setpriv --reuid=65534 --regid=65534 --clear-groups env -u GOFLAGS HOME=$$d/home GOCACHE=$$d/home/cache \
	    GOMODCACHE=$$d/mod GOPROXY=off GOTOOLCHAIN=local GOFLAGS=-buildvcs=false $(MAKE) --no-print-directory unit

sanity: ## csi-sanity (csi-test/v5) in all mode, in-process: dir, XFS reflink, btrfs, block, ext4, xfs, unprivileged
	$(NOCGO) $(GO) test $(TRIM) $(GOTEST_FLAGS) -v ./tests/sanity/...

test-cluster: tools ## cluster-mode tests against a real etcd + kube-apiserver (part of make test)
	$(NOCGO) $(GO) test $(TRIM) $(GOTEST_FLAGS) -v ./tests/cluster/...

# The control plane for the cluster tests, built from Go modules in one
# module of their own, tests/tools/k8s, with the end-to-end cluster's
# binaries (cached in _output/tools/bin; ~13 min cold on 2 cores,
# kube-apiserver 11 of them with the standard library).
tools: $(TOOLS)/etcd $(TOOLS)/kube-apiserver $(TOOLS)/kubectl $(TOOLS)/helm

$(TOOLS)/etcd: tests/tools/k8s/go.mod tests/tools/k8s/etcd/main.go
	cd tests/tools/k8s && $(NOCGO) $(GO) build $(TRIM) -ldflags "$(STRIP)" -o $@ ./etcd

$(TOOLS)/kube-apiserver $(TOOLS)/kubectl $(TOOLS)/kube-controller-manager $(TOOLS)/kube-scheduler $(TOOLS)/kubelet: tests/tools/k8s/go.mod
	cd tests/tools/k8s && $(NOCGO) $(GO) build $(TRIM) -ldflags "$(STRIP) $(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/$(notdir $@)

# kubectl kustomize and helm render deploy/ in tests/cluster/deploy.
# helm's version and default Kubernetes version (for kubeVersion checks)
# are stamped as its own Makefile does, from tests/tools/k8s/go.mod.
$(TOOLS)/helm: tests/tools/k8s/go.mod
	cd tests/tools/k8s && v=$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v3) && \
	  minor=$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2) && \
	  $(NOCGO) $(GO) build $(TRIM) -ldflags "$(STRIP) -X helm.sh/helm/v3/internal/version.version=$$v $(foreach p,pkg/lint/rules pkg/chartutil,-X helm.sh/helm/v3/$(p).k8sVersionMajor=1 -X helm.sh/helm/v3/$(p).k8sVersionMinor=$$minor)" -o $@ helm.sh/helm/v3/cmd/helm

# controller-gen (make generate, verify-generated) builds in tests/tools/k8s
# too, on the versions the control plane compiles; its version (stamped
# into the CRDs' annotations) is the module's.
$(CONTROLLER_GEN): tests/tools/k8s/go.mod
	cd tests/tools/k8s && v=$$($(GO) list -m -f '{{.Version}}' sigs.k8s.io/controller-tools) && \
	  $(NOCGO) $(GO) build $(TRIM) -ldflags "$(STRIP) -X sigs.k8s.io/controller-tools/pkg/version.version=$$v" -o $@ sigs.k8s.io/controller-tools/cmd/controller-gen

GENERATE_ARGS := object paths=./pkg/cluster/api/... crd:crdVersions=v1 output:crd:artifacts:config=deploy/kubernetes/crds
generate: $(CONTROLLER_GEN) ## regenerate deepcopy code and the CRDs in deploy/
	$(CONTROLLER_GEN) $(GENERATE_ARGS)

# Part of verify: runs make generate's command in a scratch copy of the module
# (go.mod, go.sum, pkg/; generated files removed first, CRD folder empty) and
# fails when anything it writes differs from what is committed.
verify-generated: $(CONTROLLER_GEN)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	  cp -r go.mod go.sum pkg $$tmp/; find $$tmp/pkg -name 'zz_generated.*' -delete; mkdir -p $$tmp/deploy/kubernetes/crds; \
	  (cd $$tmp && $(CONTROLLER_GEN) $(GENERATE_ARGS)); \
	  diff -r pkg $$tmp/pkg >$$tmp/diff && diff -r deploy/kubernetes/crds $$tmp/deploy/kubernetes/crds >>$$tmp/diff || \
	  { cat $$tmp/diff; echo "generated files are stale (the diff above is committed vs generated): run make generate"; exit 1; }

# Every fuzz target under pkg/ for FUZZTIME each. A failing input is saved
# by go test in the package's testdata/fuzz/<target>/: commit it, and it runs
# as a seed in every go test from then on.
FUZZTIME ?= 3s
.PHONY: fuzz stress
fuzz: ## run every fuzz target for FUZZTIME (default 3s) each
	@set -e; log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for f in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg); do \
	  for t in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
	    echo "fuzz $$t ($$(dirname $$f), $(FUZZTIME))"; \
	    for try in 1 2; do \
	      if $(GO) test -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$f) >$$log 2>&1; then break; fi; \
	      tail -20 $$log; \
	      if grep -q 'Failing input written to' $$log || [ $$try = 2 ]; then exit 1; fi; \
	      echo "fuzz $$t: the fuzzing engine failed without a failing input (above); once more"; \
	    done; \
	  done; done

stress: tools ## long reliability runs (as root): 500 kills in all mode and 500 node-plugin kills in cluster mode, longer concurrency, fuzzing 60s per target
	LOCALDIR_STRESS=1 $(GO) test $(GOTEST_FLAGS) -race -v -timeout 120m ./tests/reliability/
	$(MAKE) fuzz FUZZTIME=60s

bench: deps tools ## benchmarks: CO-like client over the driver's socket, fio through every kind of volume, a restore onto another node against cp, fio between snapshot copies, changed block tracking on a 10 GiB volume (as root)
	$(NOCGO) $(GO) test $(TRIM) -run '^$$' -bench . -benchtime 1x -count 1 -timeout 60m ./tests/bench/
	$(NOCGO) $(GO) test $(TRIM) -run '^$$' -bench 'BenchmarkTransfer|BenchmarkFioSnapshotCopies' -benchtime 1x -count 1 -timeout 30m ./tests/cluster/multinode/

$(CSI_SANITY):
	GOBIN=$(OUT)/bin $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_TEST_VERSION)

demo-sanity: build $(CSI_SANITY) ## run the driver in all mode (no Kubernetes) and csi-sanity against it
	@bash tests/demo/demo.sh "$(BIN)" "$(CSI_SANITY)"

# ---- End-to-end: a whole local cluster (tests/e2e, docs/e2e.md) ----------
# The rest of Kubernetes, the CSI sidecars and snapshot-controller (built in
# tests/tools/k8s too, so they reuse its compiled dependencies), the
# stand-ins for node-driver-registrar, livenessprobe and csi-snapshot-metadata (tests/e2e/standins:
# the module proxy serves neither), the pause binary for the pause image and
# the snapshot CRDs; cached in _output/ like `tools`.
SIDECARS := csi-provisioner@github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner \
	csi-attacher@github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher \
	csi-resizer@github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer \
	csi-snapshotter@github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter \
	snapshot-controller@github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller
SIDECAR_BINS := $(foreach s,$(SIDECARS),$(TOOLS)/$(firstword $(subst @, ,$(s))))
SNAPSHOT_CRDS := $(OUT)/tools/snapshot-crds
E2E_CLUSTER := $(OUT)/e2e-cluster
E2E_TOOLS := $(TOOLS)/etcd $(TOOLS)/kube-apiserver $(TOOLS)/kubectl $(TOOLS)/helm \
	$(TOOLS)/kube-controller-manager $(TOOLS)/kube-scheduler $(TOOLS)/kubelet \
	$(SIDECAR_BINS) $(TOOLS)/registrar $(TOOLS)/livenessprobe $(TOOLS)/snapshot-metadata $(TOOLS)/pause $(TOOLS)/floor $(SNAPSHOT_CRDS)/.done

e2e-tools: $(E2E_TOOLS) ## build the end-to-end cluster's binaries (Kubernetes, sidecars, registrar, livenessprobe and snapshot-metadata stand-ins, pause)

$(SIDECAR_BINS) &: tests/tools/k8s/go.mod
	cd tests/tools/k8s && for s in $(SIDECARS); do \
	  bin=$${s%%@*}; pkg=$${s#*@}; v=$$($(GO) list -m -f '{{.Version}}' $$(echo $$pkg | sed 's,/cmd/.*,,')) && \
	  $(NOCGO) $(GO) build $(TRIM) -ldflags "$(STRIP) -X main.version=$$v" -o $(TOOLS)/$$bin $$pkg || exit 1; done

$(SNAPSHOT_CRDS)/.done: tests/tools/k8s/go.mod
	mkdir -p $(SNAPSHOT_CRDS)
	cd tests/tools/k8s && d=$$($(GO) list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8) && \
	  install -m 0644 $$d/config/crd/*storage.k8s.io_*.yaml $(SNAPSHOT_CRDS)/
	touch $@

$(TOOLS)/registrar $(TOOLS)/livenessprobe $(TOOLS)/snapshot-metadata &: tests/e2e/standins/go.mod tests/e2e/standins/registrar/main.go tests/e2e/standins/livenessprobe/main.go tests/e2e/standins/snapshot-metadata/main.go
	cd tests/e2e/standins && $(GO) build -o $(TOOLS)/registrar ./registrar && $(GO) build -o $(TOOLS)/livenessprobe ./livenessprobe && $(GO) build -o $(TOOLS)/snapshot-metadata ./snapshot-metadata

$(TOOLS)/floor: tests/e2e/floor/main.go
	$(NOCGO) $(GO) build $(TRIM) -o $@ ./tests/e2e/floor

$(TOOLS)/pause: tests/e2e/images/pause/main.go
	$(NOCGO) $(GO) build $(TRIM) -ldflags "-s -w" -o $@ ./tests/e2e/images/pause

$(E2E_CLUSTER): FORCE
	$(NOCGO) $(GO) build $(TRIM) -o $@ ./tests/e2e/cmd/e2e-cluster

E2E_TIMEOUT ?= 45m
# make e2e starts two nodes unless E2E_NODES says otherwise; make demo one.
e2e: deps build e2e-tools $(E2E_CLUSTER) ## end-to-end tests on a real local cluster of two nodes (E2E_NODES): kubelets, containerd, sidecars (as root)
	@rc=0; E2E_NODES=$${E2E_NODES:-2} $(NOCGO) $(GO) test $(TRIM) $(GOTEST_FLAGS) -tags e2e -v -timeout $(E2E_TIMEOUT) ./tests/e2e/ || rc=$$?; \
	  $(E2E_CLUSTER) down --check || rc=1; exit $$rc

BENCH_CLUSTER ?= BenchmarkCluster
bench-cluster: deps build e2e-tools $(E2E_CLUSTER) ## one node with 5,000 volumes and kube-apiserver's CPU per LocalVolume write (envtest), then many PVCs at once on the local cluster against a stand-in driver (the floor); API requests per volume (as root; ~15 min)
	$(NOCGO) $(GO) test $(TRIM) -v -run '^$$' -bench . -benchtime 1x -timeout 30m ./tests/cluster/scale/
	@rc=0; $(NOCGO) $(GO) test $(TRIM) -tags e2e -v -run '^$$' -bench '$(BENCH_CLUSTER)' -benchtime 1x -timeout 60m ./tests/e2e/ || rc=$$?; \
	  $(E2E_CLUSTER) down --check || rc=1; exit $$rc

demo: deps build e2e-tools $(E2E_CLUSTER) ## the main job: a local Kubernetes cluster, localdir installed, PVCs, pods, snapshots, resize
	@bash tests/e2e/demo.sh "$(E2E_CLUSTER)"

demo-down: $(E2E_CLUSTER) ## tear down the cluster that make demo left running
	@$(E2E_CLUSTER) down --check

# ---- The Kubernetes external storage e2e suite (docs/e2e.md) --------------
# e2e.test is `go test -c` of k8s.io/kubernetes/test/e2e, built in
# tests/tools/e2etest with the version ldflags; agnhost (CGO off) goes into
# the suite's agnhost image; the ginkgo CLI runs e2e.test in parallel. On
# demand only: not part of test, e2e or CI. E2E_K8S_BUILD_FLAGS (e.g. -p 1)
# lowers the build's parallelism on a busy machine.
E2E_K8S_BINS := $(TOOLS)/e2e.test $(TOOLS)/agnhost $(TOOLS)/ginkgo
E2E_K8S_BUILD_FLAGS ?=
$(TOOLS)/e2e.test: tests/tools/e2etest/go.mod
	cd tests/tools/e2etest && $(GO) test -c $(E2E_K8S_BUILD_FLAGS) -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/test/e2e

$(TOOLS)/agnhost: tests/tools/e2etest/go.mod
	cd tests/tools/e2etest && CGO_ENABLED=0 $(GO) build $(E2E_K8S_BUILD_FLAGS) -ldflags "-s -w" -o $@ k8s.io/kubernetes/test/images/agnhost

$(TOOLS)/ginkgo: tests/tools/e2etest/go.mod
	cd tests/tools/e2etest && $(GO) build -o $@ github.com/onsi/ginkgo/v2/ginkgo

e2e-k8s: deps build e2e-tools $(E2E_CLUSTER) $(E2E_K8S_BINS) ## Kubernetes external storage e2e suite on the local cluster of two nodes, up and down (as root; ~30 min, on demand)
	@bash tests/e2e/k8s-suite.sh "$(E2E_CLUSTER)"

FORCE:

verify: verify-generated ## gofmt, go vet, and generated code (deepcopy, CRDs) up to date
	@test -z "$$(gofmt -l cmd pkg tests)" || { echo "gofmt needed:"; gofmt -l cmd pkg tests; exit 1; }
	$(NOCGO) $(GO) vet $(TRIM) ./...
	$(NOCGO) $(GO) vet $(TRIM) -tags e2e ./tests/e2e/

# The image's version comes from one place: the driver image tag in
# deploy/kubernetes/kustomization.yaml (which deploy/helm/localdir/values.yaml
# mirrors, checked by tests/cluster/deploy).
IMAGE ?= localdir/localdir-csi
IMAGE_TAG ?= $(shell awk '/name: localdir\/localdir-csi/{getline; print $$2}' deploy/kubernetes/kustomization.yaml)

static: ## the image's static binary (same build command as the Dockerfile) into _output/static/
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "-s -w -X github.com/localdir-csi/localdir/pkg/driver.version=$(IMAGE_TAG)" -o $(OUT)/static/localdir-csi ./cmd/localdir-csi

image: ## build the container image with Docker (needs a Docker engine; make image-oci needs none)
	docker build --build-arg VERSION=$(IMAGE_TAG) -t $(IMAGE):$(IMAGE_TAG) .

# The image the Dockerfile describes, built without Docker or a registry by
# the end-to-end harness's builder (umoci, this machine's Debian bookworm
# packages): an OCI archive to push with skopeo (docs/install.md).
IMAGE_OCI := $(OUT)/image/localdir-csi-$(IMAGE_TAG).tar
image-oci: deps $(E2E_CLUSTER) ## build the image the Dockerfile describes without Docker, as an OCI archive in _output/image/ (as root, on Debian bookworm)
	$(E2E_CLUSTER) image --out $(IMAGE_OCI)

clean: ## remove build output
	rm -rf $(OUT)
