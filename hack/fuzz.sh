#!/usr/bin/env bash
# Runs every fuzz target in the module for a bounded time each: hack/fuzz.sh DURATION.
# Targets are found by their declaration (func FuzzXxx(f *testing.F)); new ones join without
# editing this script.
set -euo pipefail
fuzztime=${1:-10s}
cd "$(dirname "$0")/.."
found=0
while IFS=: read -r file _ decl; do
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*).*/\1/' <<<"$decl")
	pkg=./$(dirname "$file")
	echo "[fuzz] $pkg $name for $fuzztime"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
	found=$((found + 1))
done < <(git grep -n -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' -- '*_test.go' || true)
echo "[fuzz] ran $found fuzz targets"
