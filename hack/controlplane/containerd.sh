#!/usr/bin/env bash
# Builds what real containers on the local nodes need and caches it by version: containerd v2
# (containerd, containerd-shim-runc-v2, ctr) from Go modules, crihelper (the harness's CRI helper
# that stops and removes a node's pods at teardown) from the Kubernetes wrapper module, and the
# pause image (a small static C program, packed here as an OCI archive; nothing is pulled). runc
# and the CNI plugins come from Debian (hack/controlplane/deps.sh).
#
# Usage: hack/controlplane/containerd.sh      # build if needed, print the bin directory
#
# The bin directory holds the binaries and pause.tar (image localhost/gpuhealth/pause:1, see
# test/controlplane/containerd.go). Progress goes to stderr, the directory to stdout. A cold build
# takes ~2-4 min on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
containerd_version=v2.4.2
cache_root=${GPUHEALTH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}
key=$(cat "$here/containerd.sh" "$here/pause.c" "$here"/kubernetes/crihelper/*.go "$here/kubernetes/go.sum" |
	sha256sum | cut -c1-12)
bin_dir="$cache_root/containerd/$containerd_version-$key/bin"
outputs=(containerd containerd-shim-runc-v2 ctr crihelper pause.tar)

log() { printf '[containerd %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

have_all() {
	local o
	for o in "${outputs[@]}"; do [[ -s "$bin_dir/$o" ]] || return 1; done
}
if have_all; then
	echo "$bin_dir"
	exit 0
fi
mkdir -p "$cache_root/containerd"
exec 9>"$cache_root/containerd/.lock"
flock 9
if have_all; then
	echo "$bin_dir"
	exit 0
fi
staging=$(mktemp -d "$cache_root/containerd/.build.XXXXXX")
trap 'rm -rf "$staging"' EXIT
start=$SECONDS

log "building containerd $containerd_version (containerd, shim, ctr) from Go modules"
# no_btrfs: Debian's btrfs headers are not needed; the nodes use the overlayfs snapshotter.
GOBIN=$staging GOFLAGS=-mod=mod CGO_ENABLED=1 go install -trimpath -ldflags "-s -w" -tags no_btrfs \
	"github.com/containerd/containerd/v2/cmd/containerd@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$containerd_version" \
	"github.com/containerd/containerd/v2/cmd/ctr@$containerd_version"
log "containerd built in $((SECONDS - start))s"
(cd "$here/kubernetes" && go build -trimpath -ldflags "-s -w" -o "$staging/crihelper" ./crihelper)

log "building the pause image"
image=$(mktemp -d)
trap 'rm -rf "$staging" "$image"' EXIT
mkdir -p "$image/rootfs" "$image/oci/blobs/sha256"
gcc -Os -static -o "$image/rootfs/pause" "$here/pause.c"
strip "$image/rootfs/pause"
# blob FILE: move FILE into the layout under its digest; print "sha256:HEX SIZE".
blob() {
	local hex size
	hex=$(sha256sum "$1" | cut -d' ' -f1)
	size=$(stat -c %s "$1")
	mv "$1" "$image/oci/blobs/sha256/$hex"
	echo "sha256:$hex $size"
}
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$image/rootfs" -cf "$image/layer.tar" pause
diff_id=$(sha256sum "$image/layer.tar" | cut -d' ' -f1)
read -r layer_digest layer_size < <(blob "$image/layer.tar")
printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$(go env GOARCH)" "$diff_id" >"$image/config.json"
read -r config_digest config_size < <(blob "$image/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
	"$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$image/manifest.json"
read -r manifest_digest manifest_size < <(blob "$image/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"annotations":{"io.containerd.image.name":"localhost/gpuhealth/pause:1","org.opencontainers.image.ref.name":"1"}}]}' \
	"$manifest_digest" "$manifest_size" >"$image/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$image/oci/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$image/oci" -cf "$staging/pause.tar" .

mkdir -p "$(dirname "$bin_dir")"
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
trap 'rm -rf "$image"' EXIT
log "ready in $((SECONDS - start))s: $("$bin_dir/containerd" --version)"
echo "$bin_dir"
