#!/usr/bin/env bash
# Builds the gpuhealth image offline into bin/gpuhealth-image.tar: an OCI archive holding an image
# index for linux/amd64 and linux/arm64, tagged gpuhealth/gpuhealth:<chart appVersion> (the chart's
# default image). Nothing is pulled: each architecture's root filesystem is staged here by
# hack/image-rootfs.sh (arm64 cross-compiled with Debian's toolchain), and the Dockerfile's
# prebuilt stage copies it into a scratch image with podman (installed from Debian's packages by
# hack/image-deps.sh). Each root filesystem is smoke-tested before it is packed: amd64 by running
# the binary chrooted into it, arm64 under qemu-user with the rootfs's own loader and glibc.
#
#   hack/image.sh [ARCH...]      default: amd64 arm64
set -euo pipefail
cd "$(dirname "$0")/.."

hack/image-deps.sh
archs=("$@")
((${#archs[@]})) || archs=(amd64 arm64)
version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deployments/helm/gpuhealth/Chart.yaml)
image=gpuhealth/gpuhealth:$version
out=bin/gpuhealth-image.tar
# podman's own storage, git-ignored and kept between runs.
store=${GPUHEALTH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuhealth}/podman
podman=(podman --root "$store/root" --runroot "$store/run" --storage-driver vfs)

say() { echo "[image] $*" >&2; }

for arch in "${archs[@]}"; do
	rootfs=bin/image/rootfs-$arch
	say "staging $rootfs"
	hack/image-rootfs.sh "$arch" "$rootfs" "$version"
	# Natively in a chroot; a foreign architecture under qemu-user with the rootfs's own loader.
	for run in "gpuhealth version" "gpuhealth-agent --version"; do
		read -r bin arg <<<"$run"
		smoke=(chroot "$rootfs" "/$bin" "$arg")
		if [[ $(go env GOARCH) != "$arch" ]]; then
			qemu=$([[ $arch == arm64 ]] && echo qemu-aarch64 || echo qemu-x86_64)
			smoke=("$qemu" -L "$rootfs" "$rootfs/$bin" "$arg")
		fi
		if ! command -v "${smoke[0]}" >/dev/null 2>&1; then
			say "cannot smoke-test $arch here (${smoke[0]} missing)"
		elif ! got=$("${smoke[@]}" 2>&1); then
			say "the $arch root filesystem does not run $bin: $got"
			exit 1
		else
			say "$arch smoke test: $got"
		fi
	done
	"${podman[@]}" build --quiet --network=none --pull=never --platform "linux/$arch" \
		--build-arg BUILD=prebuilt --build-arg VERSION="$version" \
		-t "$image-$arch" -f Dockerfile . >/dev/null
done

say "packing ${archs[*]} into $out"
"${podman[@]}" manifest rm "$image" >/dev/null 2>&1 || true
"${podman[@]}" manifest create "$image" >/dev/null
for arch in "${archs[@]}"; do
	"${podman[@]}" manifest add "$image" "containers-storage:localhost/$image-$arch" >/dev/null
done
rm -f "$out"
"${podman[@]}" manifest push --all --quiet "$image" "oci-archive:$out:$image" >/dev/null
say "$out: $(du -h "$out" | cut -f1) ($image for ${archs[*]})"
for arch in "${archs[@]}"; do
	say "  $arch: gpuhealth $(du -h "bin/image/rootfs-$arch/gpuhealth" | cut -f1), gpuhealth-agent $(du -h "bin/image/rootfs-$arch/gpuhealth-agent" | cut -f1), root filesystem $(du -sh "bin/image/rootfs-$arch" | cut -f1)"
done
