#!/usr/bin/env bash
# Installs what `make image` needs when it is missing, from Debian's packages only: podman to build
# the image offline, the aarch64 cross toolchain and C library for the arm64 binary (go-nvml is
# cgo), and qemu-user to smoke-test that binary here. Idempotent and quiet when everything is there.
set -euo pipefail
exec "$(dirname "$0")/ensure-packages.sh" podman=podman aarch64-linux-gnu-gcc=gcc-aarch64-linux-gnu \
	qemu-aarch64=qemu-user /usr/aarch64-linux-gnu/lib/libc.so.6=libc6-dev-arm64-cross
