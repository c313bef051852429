# gpuhealth's front door. `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO        ?= go
BIN       := bin
GOFLAGS_TEST ?= -race -count=1
# Real kubelet nodes that cluster-up starts (gpuhealth-node-0..NODES-1); CONTAINERS=1 gives them
# containerd + runc + CNI instead of the fake CRI, so pods really run.
NODES     ?= 1
CONTAINERS ?= 0
# Simulated GPUs each cluster-up node publishes in a ResourceSlice (driver gpu.nvidia.com).
GPUS      ?= 8
# The image the chart runs by default (make image tags it so).
IMAGE     := gpuhealth/gpuhealth:$(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' deployments/helm/gpuhealth/Chart.yaml)
# Tools are installed by hack/tools.sh into $(TOOLS_BIN), keyed by version.
TOOLS_BIN := $(shell hack/tools.sh bindir)
# Example embedders, each its own Go module (./... of the main module does not reach them).
EXAMPLES  := examples/dra-driver examples/device-plugin

.PHONY: help
help: ## List the targets.
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
# grpcnotrace: gRPC's x/net/trace brings html/template, whose reflection keeps every method of
# every linked type: gpuhealth is 50 MB without it, 89 MB with it.
build: ## Build bin/gpuhealth, bin/gpuhealth-agent (the agent alone, as the DaemonSet runs it) and the simulated NVIDIA driver, bin/sim-driver/<version>/libnvidia-ml.so.<version>.
	$(GO) build -tags grpcnotrace -o $(BIN)/gpuhealth ./cmd/gpuhealth
	$(GO) build -tags grpcnotrace -o $(BIN)/gpuhealth-agent ./cmd/gpuhealth-agent
	hack/sim-driver.sh $(BIN)/sim-driver >/dev/null

.PHONY: image
image: ## bin/gpuhealth-image.tar: the image (OCI archive, linux/amd64 + linux/arm64, tagged as the chart expects), built offline with podman.
	hack/image.sh

.PHONY: kubectl-plugin
kubectl-plugin: build ## bin/kubectl-gpuhealth, so that `kubectl gpuhealth status` works with bin/ on PATH.
	ln -sf gpuhealth $(BIN)/kubectl-gpuhealth

.PHONY: demo
demo: build ## The main job on a local cluster: 3 simulated GPU nodes, agents, scheduler, extender, faults, a GPU reset, a drain, pods. BACKEND=nvml: through NVML on a simulated NVIDIA driver per node. CHART=1: the Helm chart on containerd nodes instead.
	if [[ "$(CHART)" == 1 ]]; then hack/demo/chart.sh; \
	else $(GO) run ./hack/demo --gpuhealth $(BIN)/gpuhealth --scenario examples/demo-scenario.yaml --backend $(or $(BACKEND),sim); fi

.PHONY: simulate
simulate: build ## Replay examples/scenario.yaml (an hour of faults on 8 GPUs) on virtual time.
	$(BIN)/gpuhealth simulate --scenario examples/scenario.yaml --output table

.PHONY: test
test: verify unit chart fuzz-short e2e ## Everything CI runs: lint, unit tests (race), the chart's tests, fuzzing, e2e tests on a real control plane.

.PHONY: unit
unit: ## The inner loop: unit tests of every module with the race detector, NVIDIA's real NVML libraries (hack/nvidia-drivers.sh) included; no helm, promtool or fuzzing (make chart, make fuzz).
	GPUHEALTH_NVIDIA_DRIVERS="$$(hack/nvidia-drivers.sh)" $(GO) test $(GOFLAGS_TEST) $$($(GO) list ./... | grep -v '/test/helm$$')
	for m in $(EXAMPLES); do (cd $$m && $(GO) test $(GOFLAGS_TEST) ./...); done

.PHONY: chart
chart: ## The chart's tests: helm lint and template, the rendered objects and policies, promtool on the alerts.
	hack/tools.sh install helm promtool
	$(GO) test $(GOFLAGS_TEST) ./test/helm/...

.PHONY: fuzz-short
fuzz-short: ## A short run of every fuzz target (10s each), as make test runs it; make fuzz runs them longer.
	hack/fuzz.sh 10s

.PHONY: e2e
e2e: controlplane $(BIN)/gpuhealth-image.tar ## e2e tests against a real etcd + kube-apiserver + scheduler + controller-manager (and containerd nodes).
	hack/tools.sh install helm
	GPUHEALTH_CONTROLPLANE_BIN="$$(hack/controlplane/build.sh)" GPUHEALTH_CONTAINERD_BIN="$$(hack/controlplane/containerd.sh)" \
	GPUHEALTH_IMAGE_ARCHIVE=$(abspath $(BIN)/gpuhealth-image.tar) GPUHEALTH_NVIDIA_DRIVERS="$$(hack/nvidia-drivers.sh)" \
	GPUHEALTH_IMAGE_ROOTFS=$(abspath $(BIN)/image/rootfs-$(shell $(GO) env GOARCH)) $(GO) test -count=1 -tags e2e -timeout 30m ./test/e2e/...

.PHONY: controlplane
controlplane: ## Build (or find cached) etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, kubelet, containerd; install the tools real nodes need.
	hack/controlplane/deps.sh
	hack/controlplane/build.sh >/dev/null
	hack/controlplane/containerd.sh >/dev/null

.PHONY: cluster-up
cluster-up: controlplane ## Start a local cluster with NODES real kubelet nodes (default 1; CONTAINERS=1: with containerd), each publishing GPUS simulated GPUs (default 8) for DRA, in the background; kubeconfig in .cluster/kubeconfig.
	NODES=$(NODES) CONTAINERS=$(CONTAINERS) GPUS=$(GPUS) hack/controlplane/cluster.sh up

.PHONY: image-load
image-load: $(BIN)/gpuhealth-image.tar ## Import the image (built for this machine if missing or older than the sources) into every node of cluster-up's cluster (CONTAINERS=1).
	hack/controlplane/cluster.sh image-load $(BIN)/gpuhealth-image.tar $(IMAGE)

# The image for this machine's architecture when `make image` has not built both (image-load, e2e).
$(BIN)/gpuhealth-image.tar: $(shell find cmd internal pkg -name '*.go') go.mod go.sum Dockerfile
	hack/image.sh "$$($(GO) env GOARCH)"

.PHONY: cluster-down
cluster-down: ## Stop everything cluster-up started.
	hack/controlplane/cluster.sh down

.PHONY: lint
lint: ## golangci-lint (pinned, installed by hack/tools.sh), including the go-nvml import rule, and logcheck -check-contextual (contextual logging only).
	hack/tools.sh install golangci-lint logcheck
	$(TOOLS_BIN)/golangci-lint run ./...
	$(TOOLS_BIN)/logcheck -check-contextual -config hack/logcheck.conf ./...
	for m in $(EXAMPLES); do (cd $$m && $(TOOLS_BIN)/golangci-lint run ./... && $(TOOLS_BIN)/logcheck -check-contextual ./...); done

.PHONY: generate-proto
generate-proto: ## Regenerate the committed Go code of gpuhealth's .proto files (pkg/nvsentinel/datamodels): protoc from Debian's protobuf-compiler, its Go plugins pinned in hack/tools.sh.
	hack/generate-proto.sh

.PHONY: verify
verify: lint ## gofmt, go vet, go mod tidy, generated docs, and lint.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	for m in $(EXAMPLES); do (cd $$m && $(GO) vet ./...); done
	hack/verify-tidy.sh
	@$(GO) run ./hack/xiddoc | diff -u docs/xid-policy.md - || { echo "docs/xid-policy.md is stale: go run ./hack/xiddoc > docs/xid-policy.md"; exit 1; }

.PHONY: bench
bench: build controlplane $(BIN)/gpuhealth-image.tar ## Every figure of docs/benchmarks.md as one table (library, agent idle/storm from /proc and in a container as the kubelet sees it, signal->object latency, extender, 500-node fleet, 5,000-node fleet, each limit beside its figure), medians of several runs; ~25 min. Raw output in bin/bench/.
	hack/tools.sh install helm
	GPUHEALTH_CONTROLPLANE_BIN="$$(hack/controlplane/build.sh)" GPUHEALTH_CONTAINERD_BIN="$$(hack/controlplane/containerd.sh)" \
	GPUHEALTH_IMAGE_ARCHIVE=$(abspath $(BIN)/gpuhealth-image.tar) $(GO) run ./hack/bench --gpuhealth $(BIN)/gpuhealth --agent $(BIN)/gpuhealth-agent --out docs/benchmarks.md --raw $(BIN)/bench

.PHONY: bench-fleet-50k
bench-fleet-50k: build controlplane ## The fleet at 50,000 nodes x 8 GPUs (issue 49; not in make bench or CI): NODES (50000) nodes, AGENTS (2000) with a real agent and the rest written as agents write them; time to taint (single faults, 10% wave) beside bare clients, API traffic, kube-apiserver/etcd RSS, extender, breaker counter, gpuhealth status. One run, ~30 min; merges its rows into docs/benchmarks.md. Raw output in bin/bench-50k/.
	GPUHEALTH_CONTROLPLANE_BIN="$$(hack/controlplane/build.sh)" $(GO) run ./hack/bench -skip library,agent,container,latency,fleet \
		-fleet-50k $${NODES:-50000} -fleet-50k-agents $${AGENTS:-2000} --gpuhealth $(BIN)/gpuhealth --out docs/benchmarks.md --raw $(BIN)/bench-50k

.PHONY: bench-lib
bench-lib: ## Library, kernel-log and extender benchmarks only (testing.B, one core, one package at a time, allocations); raw output in bin/bench.txt.
	@mkdir -p $(BIN)
	$(GO) test -p 1 -run '^$$' -bench . -benchmem -count 5 -cpu 1 ./pkg/health/... ./pkg/gpu/kmsg/... ./internal/scheduling/... | tee $(BIN)/bench.txt

.PHONY: bench-e2e
bench-e2e: controlplane ## Signal -> API object latency (p50/p99 over 200 faults) and writes per change, real control plane: hack/bench's latency part, one run. Raw output in bin/bench-e2e/.
	GPUHEALTH_CONTROLPLANE_BIN="$$(hack/controlplane/build.sh)" $(GO) run ./hack/bench -skip library,agent,container,fleet -runs 1 -faults $${FAULTS:-200} -out '' -raw $(BIN)/bench-e2e

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 1m each).
	hack/fuzz.sh $${FUZZTIME:-1m}

.PHONY: clean
clean: ## Remove build outputs (not the control-plane cache).
	rm -rf $(BIN)
