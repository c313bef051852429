#!/usr/bin/env bash
# Smoke test of the NVML backend on a machine with an NVIDIA GPU and driver:
#
#   1. builds bin/gpuhealth (go build), unless GPUHEALTH_BIN names a binary built elsewhere
#      (the device machine may have no Go toolchain: build here, carry bin/, and pass
#      GPUHEALTH_BIN=bin/gpuhealth);
#   2. runs `gpuhealth probe` (table and JSON) and checks it found at least one GPU;
#   3. runs `gpuhealth watch --backend nvml --output json` for WATCH_SECONDS (default 30), stops
#      it with SIGINT and checks it exits 0 on its own;
#   4. prints a summary, with nvidia-smi's view of the same GPUs for comparison.
#
# Everything is bounded in time (well under 5 minutes) and the script exits non-zero on any
# failure. Outputs go to ${OUT:-/tmp/gpu-smoke} (at most 6 files: summary.txt, probe.txt,
# probe.json, watch.jsonl, smoke.log, nvidia-smi.txt). See docs/nvml.md.
set -euo pipefail
cd "$(dirname "$0")/.."

out_dir=${OUT:-/tmp/gpu-smoke}
watch_seconds=${WATCH_SECONDS:-30}
mkdir -p "$out_dir"
log="$out_dir/smoke.log"
summary="$out_dir/summary.txt"
: >"$log"
started=$(date +%s)
failures=()

say() { echo "[gpu-smoke] $*" | tee -a "$log" >&2; }
fail() {
	failures+=("$1")
	say "FAIL: $1"
}

# Where this script runs, for the record.
{
	echo "host: $(uname -a)"
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >>"$log"
if command -v nvidia-smi >/dev/null 2>&1; then
	timeout 30 nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,temperature.gpu,power.draw,power.limit,mig.mode.current \
		--format=csv >"$out_dir/nvidia-smi.txt" 2>&1 || say "nvidia-smi failed (see nvidia-smi.txt)"
else
	echo "nvidia-smi not found" >"$out_dir/nvidia-smi.txt"
	say "nvidia-smi not found; continuing (gpuhealth loads libnvidia-ml.so.1 itself)"
fi

# 1. The binary.
bin=${GPUHEALTH_BIN:-}
if [[ -z "$bin" ]]; then
	if ! command -v go >/dev/null 2>&1; then
		fail "no Go toolchain here and GPUHEALTH_BIN is not set: build bin/gpuhealth elsewhere and pass GPUHEALTH_BIN"
		printf '%s\n' "${failures[@]}" >"$summary"
		exit 1
	fi
	bin=bin/gpuhealth
	say "building $bin"
	if ! timeout 180 go build -o "$bin" ./cmd/gpuhealth >>"$log" 2>&1; then
		fail "go build failed (see smoke.log)"
		printf '%s\n' "${failures[@]}" >"$summary"
		exit 1
	fi
fi
if [[ ! -x "$bin" ]]; then
	fail "$bin is not an executable"
	printf '%s\n' "${failures[@]}" >"$summary"
	exit 1
fi
say "binary: $bin ($("$bin" version 2>&1 || true))"

# 2. probe, twice.
say "gpuhealth probe (table)"
if ! timeout 60 "$bin" probe --output table >"$out_dir/probe.txt" 2>>"$log"; then
	fail "probe --output table exited non-zero (see smoke.log)"
fi
cat "$out_dir/probe.txt" >&2 || true
say "gpuhealth probe (json)"
if ! timeout 60 "$bin" probe --output json >"$out_dir/probe.json" 2>>"$log"; then
	fail "probe --output json exited non-zero (see smoke.log)"
fi
gpus=0 lost="-" unsupported="-" events="-" read_errors="-"
if [[ -s "$out_dir/probe.json" ]]; then
	if command -v jq >/dev/null 2>&1; then
		if ! gpus=$(jq -e '.gpus | length' "$out_dir/probe.json" 2>>"$log"); then
			fail "probe.json is not the expected JSON"
			gpus=0
		fi
		lost=$(jq '[.gpus[] | select(.readings.lost == true)] | length' "$out_dir/probe.json" 2>/dev/null || echo "?")
		unsupported=$(jq -r '[.gpus[].readings.unsupported // [] | .[]] | unique | join(",")' "$out_dir/probe.json" 2>/dev/null || echo "?")
		events=$(jq -r '[.gpus[].events[]] | unique | join(",")' "$out_dir/probe.json" 2>/dev/null || echo "?")
		read_errors=$(jq '[.gpus[].readings.errors // [] | .[]] | length' "$out_dir/probe.json" 2>/dev/null || echo "?")
	else
		gpus=$(grep -c '"pciBusID"' "$out_dir/probe.json" || true)
	fi
fi
if [[ "${gpus:-0}" -lt 1 ]]; then
	fail "probe found no GPU"
fi

# 3. watch for a while, then SIGINT; it must stop by itself within 15 s.
say "gpuhealth watch --backend nvml for ${watch_seconds}s"
set +e
timeout --preserve-status -s INT -k 15 "$watch_seconds" \
	"$bin" watch --backend nvml --output json >"$out_dir/watch.jsonl" 2>>"$log"
watch_rc=$?
set -e
case $watch_rc in
0) ;;
137) fail "watch did not stop within 15 s of SIGINT (killed)" ;;
*) fail "watch exited $watch_rc (see smoke.log)" ;;
esac
transitions=$(wc -l <"$out_dir/watch.jsonl" | tr -d ' ')
if command -v jq >/dev/null 2>&1 && [[ "$transitions" -gt 0 ]]; then
	if ! jq -s -e 'all(has("time") and has("index") and has("uuid") and has("from") and has("to") and has("reason"))' \
		"$out_dir/watch.jsonl" >/dev/null 2>>"$log"; then
		fail "watch printed a line that is not a transition object"
	fi
fi

# 4. Summary.
elapsed=$(($(date +%s) - started))
{
	echo "gpu-smoke summary"
	echo "  GPUs found by probe:        $gpus"
	echo "  lost GPUs:                  $lost"
	echo "  events supported (any GPU): $events"
	echo "  readings unsupported:       ${unsupported:-none}"
	echo "  reading errors:             $read_errors"
	echo "  watch exit status:          $watch_rc (0 = stopped cleanly on SIGINT)"
	echo "  transitions during watch:   $transitions (${watch_seconds}s)"
	echo "  elapsed:                    ${elapsed}s"
	echo "  outputs:                    $out_dir"
	echo "nvidia-smi:"
	sed 's/^/  /' "$out_dir/nvidia-smi.txt"
	if [[ "$transitions" -gt 0 ]]; then
		echo "transitions:"
		sed 's/^/  /' "$out_dir/watch.jsonl"
	fi
	if [[ ${#failures[@]} -eq 0 ]]; then
		echo "RESULT: PASS"
	else
		echo "RESULT: FAIL"
		printf '  - %s\n' "${failures[@]}"
	fi
} | tee "$summary"
[[ ${#failures[@]} -eq 0 ]]
