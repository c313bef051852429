#!/usr/bin/env bash
# Stages the image's root filesystem for one architecture: the gpuhealth and gpuhealth-agent
# binaries (cgo, stripped, trimmed) plus the glibc files they need (the ELF interpreter and their
# NEEDED libraries, read with readelf) and the glibc runtime libraries NVIDIA's user-space driver
# libraries link against (driver_needs below, what distroless "cc" images carry), all from the
# same glibc, nothing else. gpuhealth dlopens libnvidia-ml.so.1 by its path under the driver root,
# so the library's own NEEDED entries resolve from these files, never from the host's glibc.
# Used by the Dockerfile's source stage and, offline, by hack/image.sh.
#
#   hack/image-rootfs.sh ARCH DIR [VERSION]     ARCH: amd64 or arm64
#
# arm64 is cross-compiled with Debian's aarch64-linux-gnu toolchain when the machine is not arm64.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:?usage: image-rootfs.sh ARCH DIR [VERSION]}
dir=${2:?usage: image-rootfs.sh ARCH DIR [VERSION]}
version=${3:-dev}
native=$(go env GOARCH)

cc=gcc
libdir=
case $arch in
amd64)
	[[ $native == amd64 ]] || cc=x86_64-linux-gnu-gcc
	libdir=/usr/x86_64-linux-gnu/lib
	;;
arm64)
	[[ $native == arm64 ]] || cc=aarch64-linux-gnu-gcc
	libdir=/usr/aarch64-linux-gnu/lib
	;;
*)
	echo "image-rootfs.sh: unsupported architecture $arch (amd64 or arm64)" >&2
	exit 2
	;;
esac

rm -rf "$dir"
mkdir -p "$dir"
# gpuhealth-agent is the agent alone, which the DaemonSet runs (cmd/gpuhealth-agent); grpcnotrace:
# see the Makefile's build.
CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc go build -trimpath -tags grpcnotrace \
	-ldflags "-s -w -X github.com/gpuhealth/gpuhealth/internal/version.Version=$version" \
	-o "$dir/gpuhealth" ./cmd/gpuhealth
CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc go build -trimpath -tags grpcnotrace \
	-ldflags "-s -w -X github.com/gpuhealth/gpuhealth/internal/version.Version=$version" \
	-o "$dir/gpuhealth-agent" ./cmd/gpuhealth-agent

# The files the dynamic loader will look for: the interpreter at its absolute path, and each
# NEEDED library in the directory the loader searches first on Debian for that architecture.
interp=$(readelf -l "$dir/gpuhealth" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
# libnvidia-ml.so.1 NEEDs libc, libdl and libpthread (470), libm too (525) and librt too (535,
# 550): read from the real libraries by test/e2e's TestDriverLibrariesNeedOnlyTheImagesGlibc.
driver_needs=(libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1)
mapfile -t needed < <({
	readelf -d "$dir/gpuhealth" "$dir/gpuhealth-agent" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'
	printf '%s\n' "${driver_needs[@]}"
} | sort -u)
[[ -n $interp ]] || {
	echo "image-rootfs.sh: $dir/gpuhealth has no interpreter" >&2
	exit 1
}
triplet=$([[ $arch == amd64 ]] && echo x86_64-linux-gnu || echo aarch64-linux-gnu)
find_lib() { # the file for a library name: the machine's own for a native build, else the cross one
	local name=$1 candidate
	local candidates=("$libdir/$name")
	[[ $cc == gcc ]] && candidates=("/lib/$triplet/$name" "/usr/lib/$triplet/$name")
	for candidate in "${candidates[@]}"; do
		if [[ -e $candidate ]]; then
			echo "$candidate"
			return
		fi
	done
	echo "image-rootfs.sh: cannot find $name for $arch in ${candidates[*]}" >&2
	return 1
}
mkdir -p "$dir$(dirname "$interp")"
cp -L "$(find_lib "$(basename "$interp")")" "$dir$interp"
mkdir -p "$dir/lib/$triplet"
for lib in "${needed[@]}"; do
	cp -L "$(find_lib "$lib")" "$dir/lib/$triplet/$lib"
done
echo "image-rootfs.sh: $dir: gpuhealth, gpuhealth-agent ($arch) + $(basename "$interp") ${needed[*]}" >&2
