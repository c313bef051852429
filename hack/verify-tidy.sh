#!/usr/bin/env bash
# Fails when go.mod or go.sum of the main module or of an example module (its own module under
# examples/) is not tidy. Leaves every go.mod and go.sum as it found them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
status=0
for mod in . examples/dra-driver examples/device-plugin; do
	cd "$root/$mod"
	tmp=$(mktemp -d)
	cp go.mod go.sum "$tmp/"
	if ! go mod tidy; then
		echo "$mod: go mod tidy failed" >&2
		status=1
	elif ! diff -q "$tmp/go.mod" go.mod >/dev/null || ! diff -q "$tmp/go.sum" go.sum >/dev/null; then
		echo "$mod: go.mod/go.sum are not tidy; run 'go mod tidy' in $mod and commit the result" >&2
		diff -u "$tmp/go.mod" go.mod >&2 || true
		status=1
	fi
	cp "$tmp/go.mod" "$tmp/go.sum" .
	rm -rf "$tmp"
done
exit "$status"
