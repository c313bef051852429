#!/usr/bin/env bash
# Installs the system tools that real kubelet nodes need (test/controlplane/nodenet.go,
# kubeletnode.go) when they are missing: ip (iproute2), nsenter, unshare and mount (util-linux,
# mount). They are Debian packages; nothing is downloaded from anywhere else. Idempotent and quiet
# when everything is there.
set -euo pipefail
exec "$(dirname "$0")/../ensure-packages.sh" ip=iproute2 nsenter=util-linux unshare=util-linux mount=mount
