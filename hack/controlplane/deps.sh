#!/usr/bin/env bash
# Installs the system tools that real kubelet nodes need (test/controlplane/nodenet.go,
# kubeletnode.go, containerd.go) when they are missing: ip (iproute2), nsenter, unshare and mount
# (util-linux, mount); for nodes with real containers runc, the CNI plugins (bridge, host-local,
# loopback in /usr/lib/cni) and a C toolchain with a static libc for the pause image
# (hack/controlplane/containerd.sh); iptables, whose LOG target gives the kernel-log e2e test a
# kernel record to read. They are Debian packages; nothing is downloaded from anywhere
# else. Idempotent and quiet when everything is there.
set -euo pipefail
exec "$(dirname "$0")/../ensure-packages.sh" ip=iproute2 nsenter=util-linux unshare=util-linux mount=mount iptables=iptables \
	runc=runc /usr/lib/cni/bridge=containernetworking-plugins gcc=gcc /usr/include/stdlib.h=libc6-dev
