#!/usr/bin/env bash
# Installs the project's pinned developer tools from the Go module proxy into a cache keyed by
# version, outside the work tree so fresh clones on the same machine reuse them.
#
#   hack/tools.sh bindir               print the directory holding the tools
#   hack/tools.sh install NAME...      install NAME if missing (golangci-lint, helm, promtool, logcheck,
#                                      protoc-gen-go, protoc-gen-go-grpc)
set -euo pipefail

GOLANGCI_LINT_VERSION=v2.15.0
# Helm is built from its Go module (no binary download); the chart tests run `helm lint` and
# `helm template` with it.
HELM_VERSION=v3.22.0
# promtool unit-tests the chart's PrometheusRule (`promtool test rules`). v0.316.0 is Prometheus
# v3.16.0, the first whose go.mod has no replace directive, which `go install module@version`
# refuses.
PROMTOOL_VERSION=v0.316.0
# logcheck (Kubernetes' structured and contextual logging checks, as dra-example-driver runs
# it): `make lint` runs it with -check-contextual.
LOGCHECK_VERSION=v0.11.0
# protoc's Go plugins, for pkg/nvsentinel/datamodels (hack/generate-proto.sh). protoc-gen-go is
# the google.golang.org/protobuf that go.mod requires, so that the generated code and the runtime
# it calls come from one commit; protoc-gen-go-grpc's code needs grpc 1.64 or later.
PROTOC_GEN_GO_VERSION=v1.36.12-0.20260120151049-f2248ac996af
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

cache_root=${GPUHEALTH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}
bin_dir="$cache_root/tools/bin"

install_tool() {
	local name=$1 module version
	case "$name" in
	golangci-lint)
		module=github.com/golangci/golangci-lint/v2/cmd/golangci-lint
		version=$GOLANGCI_LINT_VERSION
		;;
	helm)
		module=helm.sh/helm/v3/cmd/helm
		version=$HELM_VERSION
		;;
	promtool)
		module=github.com/prometheus/prometheus/cmd/promtool
		version=$PROMTOOL_VERSION
		;;
	logcheck)
		module=sigs.k8s.io/logtools/logcheck
		version=$LOGCHECK_VERSION
		;;
	protoc-gen-go)
		module=google.golang.org/protobuf/cmd/protoc-gen-go
		version=$PROTOC_GEN_GO_VERSION
		;;
	protoc-gen-go-grpc)
		module=google.golang.org/grpc/cmd/protoc-gen-go-grpc
		version=$PROTOC_GEN_GO_GRPC_VERSION
		;;
	*)
		echo "hack/tools.sh: unknown tool $name" >&2
		return 2
		;;
	esac
	local target="$bin_dir/$name-$version"
	if [[ ! -x "$target" ]]; then
		echo "[tools] installing $name $version (a cold build takes a few minutes)" >&2
		local tmp
		tmp=$(mktemp -d)
		GOBIN="$tmp" go install "$module@$version"
		mkdir -p "$bin_dir"
		mv "$tmp/$name" "$target"
		rmdir "$tmp"
	fi
	ln -sfn "$target" "$bin_dir/$name"
}

case "${1:-}" in
bindir) echo "$bin_dir" ;;
install)
	shift
	for t in "$@"; do install_tool "$t"; done
	;;
*)
	echo "usage: hack/tools.sh bindir | install NAME..." >&2
	exit 2
	;;
esac
