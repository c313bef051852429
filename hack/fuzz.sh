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
	# On a loaded machine the fuzzing engine itself can fail with "context deadline exceeded"
	# when -fuzztime ends while a worker is still busy, with no failing input: that is retried
	# once. A real finding writes its input under testdata/fuzz and fails at once.
	log=$(mktemp)
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$log"; then
		if grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
			echo "[fuzz] $name: the fuzzing engine ran out of time, not a finding; running it again"
			go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
		else
			rm -f "$log"
			exit 1
		fi
	fi
	rm -f "$log"
	found=$((found + 1))
done < <(git grep -n -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' -- '*_test.go' || true)
echo "[fuzz] ran $found fuzz targets"
