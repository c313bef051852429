#!/usr/bin/env bash
# Builds the local test cluster (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# kubectl, and for real nodes the kubelet, fakecri (a fake CRI runtime) and nodenet (the nodes'
# network namespace and its two crossings)) from Go modules and caches the binaries by version.
#
# Usage: hack/controlplane/build.sh            # build if needed, print the bin directory
#
# The cache lives outside the work tree (default ~/.cache/gpuhealth, override with
# GPUHEALTH_CACHE_DIR) so that fresh clones on the same machine - CI clones one per run - reuse
# it. The key covers the Kubernetes and etcd versions, both wrapper modules' go.sum and the Go
# version, so a change to any of them builds anew. A cold build takes 12-15 minutes on 2 cores;
# progress goes to stderr, the bin directory to stdout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kube_version=v1.37.2
etcd_version=$(grep -Eo "go.etcd.io/etcd/server/v3 v[0-9.]+" "$here/etcd/go.mod" | cut -d" " -f2)
cache_root=${GPUHEALTH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}

key_input=$(cat "$here/kubernetes/go.sum" "$here/etcd/go.sum" "$here/build.sh"; go env GOVERSION)
key=$(printf '%s' "$key_input" | sha256sum | cut -c1-12)
bin_dir="$cache_root/controlplane/kube-$kube_version-etcd-$etcd_version-$key/bin"
binaries=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet)
# The harness's own small programs change more often than Kubernetes: they have a key of their
# own (a stamp file in the bin directory), so editing one relinks it alone.
tools=(fakecri nodenet)
tools_key=$(cat "$here"/kubernetes/{fakecri,nodenet}/*.go | sha256sum | cut -c1-12)

have_all() {
	local b
	for b in "${binaries[@]}" "${tools[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
	[[ $(cat "$bin_dir/.tools-key" 2>/dev/null) == "$tools_key" ]]
}

log() { printf '[controlplane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if have_all; then
	echo "$bin_dir"
	exit 0
fi

mkdir -p "$cache_root/controlplane"
# One builder at a time: parallel test packages may all ask for the binaries.
exec 9>"$cache_root/controlplane/.lock"
flock 9
if have_all; then
	echo "$bin_dir"
	exit 0
fi

staging=$(mktemp -d "$cache_root/controlplane/.build.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# build NAME DIR PKG LDFLAGS: go build with a heartbeat so a 9-minute compile never looks hung.
build() {
	local name=$1 dir=$2 pkg=$3 ldflags=$4 start=$SECONDS
	log "building $name (cold kube-apiserver takes ~9 min and ~3 GB of memory on 2 cores)"
	(cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$staging/$name" "$pkg") &
	local pid=$!
	while kill -0 "$pid" 2>/dev/null; do
		sleep 5
		if (((SECONDS - start) % 60 < 5 && SECONDS - start >= 60)); then
			log "still building $name ($((SECONDS - start))s)"
		fi
	done
	if ! wait "$pid"; then
		log "FAILED to build $name"
		return 1
	fi
	log "built $name in $((SECONDS - start))s"
}

major=${kube_version#v}; major=${major%%.*}
minor=${kube_version#v*.}; minor=${minor%%.*}
kube_ldflags="-X k8s.io/component-base/version.gitVersion=$kube_version"
kube_ldflags+=" -X k8s.io/component-base/version.gitMajor=$major"
kube_ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
kube_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
kube_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"
kube_ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=$major"
kube_ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=$minor"

have_kubernetes() {
	local b
	for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done
}

build_tools() {
	local t
	for t in "${tools[@]}"; do build "$t" "$here/kubernetes" "./$t" ""; done
	echo "$tools_key" >"$staging/.tools-key"
}

total=$SECONDS
if have_kubernetes; then
	log "harness tools changed: relinking ${tools[*]} into $bin_dir"
	build_tools
	for t in "${tools[@]}" .tools-key; do mv -f "$staging/$t" "$bin_dir/$t"; done
	log "tools ready in $((SECONDS - total))s"
	echo "$bin_dir"
	exit 0
fi
log "cache miss: building into $bin_dir"
(cd "$here/etcd" && go mod download) && (cd "$here/kubernetes" && go mod download)
build etcd "$here/etcd" . ""
for cmd in kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet; do
	build "$cmd" "$here/kubernetes" "k8s.io/kubernetes/cmd/$cmd" "$kube_ldflags"
done
build_tools

mkdir -p "$(dirname "$bin_dir")"
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
trap - EXIT
log "control plane ready in $((SECONDS - total))s: $("$bin_dir/kube-apiserver" --version)"
echo "$bin_dir"
