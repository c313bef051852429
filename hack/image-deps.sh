#!/usr/bin/env bash
# Installs what `make image` needs when it is missing, from Debian's packages only: podman (and
# buildah) to build the image offline, the aarch64 cross toolchain and C library for the arm64
# binary (go-nvml is cgo), and qemu-user to smoke-test that binary here. Idempotent and quiet when
# everything is there.
set -euo pipefail

declare -A package_of=(
	[podman]=podman
	[aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu
	[qemu-aarch64]=qemu-user
)
missing=()
for tool in "${!package_of[@]}"; do
	command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
[[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ]] || missing+=(libc6-dev-arm64-cross)
((${#missing[@]} == 0)) && exit 0

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if ! command -v apt-get >/dev/null 2>&1; then
	echo "image-deps.sh: missing ${packages[*]} and no apt-get to install them; install them by hand" >&2
	exit 1
fi
sudo=()
((EUID == 0)) || sudo=(sudo)
echo "image-deps.sh: installing ${packages[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
