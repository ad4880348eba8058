# localdir — make help lists the targets.
SHELL := /bin/bash
GO ?= go
OUT := $(CURDIR)/_output
BIN := $(OUT)/localdir-csi
CSI_TEST_VERSION := v5.6.0
CSI_SANITY := $(OUT)/bin/csi-sanity
GOTEST_FLAGS ?= -count=1

.PHONY: help build test unit sanity bench demo verify clean

help: ## show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

build: ## build the driver binary into _output/
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/localdir-csi

test: verify ## unit, case and csi-sanity tests (as root: real bind mounts)
	$(GO) test $(GOTEST_FLAGS) -race ./...

unit: ## unit tests only (no root needed)
	$(GO) test $(GOTEST_FLAGS) ./pkg/...

sanity: ## csi-sanity (csi-test/v5) in all mode, in-process: dir, XFS reflink, btrfs, block
	$(GO) test $(GOTEST_FLAGS) -v ./tests/sanity/...

bench: ## benchmarks: CO-like client over the driver's socket (as root)
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 ./tests/bench/

$(CSI_SANITY):
	GOBIN=$(OUT)/bin $(GO) install github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$(CSI_TEST_VERSION)

demo: build $(CSI_SANITY) ## the main job: run the driver in all mode and csi-sanity against it
	@bash tests/demo/demo.sh "$(BIN)" "$(CSI_SANITY)"

verify: ## gofmt and go vet
	@test -z "$$(gofmt -l cmd pkg tests)" || { echo "gofmt needed:"; gofmt -l cmd pkg tests; exit 1; }
	$(GO) vet ./...

clean: ## remove build output
	rm -rf $(OUT)
