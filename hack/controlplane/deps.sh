#!/usr/bin/env bash
# Installs the system tools that real kubelet nodes need (test/controlplane/nodenet.go,
# kubeletnode.go) when they are missing: ip (iproute2), nsenter, unshare and mount (util-linux,
# mount). They are Debian packages; nothing is downloaded from anywhere else. Idempotent and quiet
# when everything is there.
set -euo pipefail

declare -A package_of=([ip]=iproute2 [nsenter]=util-linux [unshare]=util-linux [mount]=mount)
missing=()
for tool in "${!package_of[@]}"; do
	command -v "$tool" >/dev/null 2>&1 || missing+=("${package_of[$tool]}")
done
((${#missing[@]} == 0)) && exit 0

mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if ! command -v apt-get >/dev/null 2>&1; then
	echo "deps.sh: missing ${packages[*]} and no apt-get to install them; install them by hand" >&2
	exit 1
fi
sudo=()
((EUID == 0)) || sudo=(sudo)
echo "deps.sh: installing ${packages[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${packages[@]}" >&2
