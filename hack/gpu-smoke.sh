#!/usr/bin/env bash
# Smoke test of the NVML backend on a machine with an NVIDIA GPU and driver:
#
#   1. builds bin/gpuhealth (go build), unless GPUHEALTH_BIN names a binary built elsewhere
#      (the device machine may have no Go toolchain: build here, carry bin/, and pass
#      GPUHEALTH_BIN=bin/gpuhealth);
#   2. runs `gpuhealth probe` (table and JSON) and checks it found at least one GPU, and
#      `gpuhealth probe --raw`: the driver's raw answer to every NVML call the backend makes
#      (symbols present, event mask, ECC mode and counters, remapped rows vs retired pages,
#      thresholds, field 230, each NVLink's state, one event-set wait);
#   3. compares probe with nvidia-smi: PCI bus IDs, slowdown/shutdown thresholds, active NVLinks;
#   4. runs `gpuhealth watch --backend nvml --output json` for WATCH_SECONDS (default 30), stops
#      it with SIGINT, checks it exits 0 on its own and, on a healthy idle GPU, printed nothing;
#   5. provokes one real XID 31 (a kernel that stores to an unmapped address, PTX JIT-compiled by
#      the driver: hack/gpu-smoke/xid31.c, built with cc here or carried as bin/xid31) while a
#      watch runs with XID 31 overridden to Degraded, and checks the watch saw it; with the
#      default policy XID 31 is an application error and leaves the GPU Healthy;
#   6. runs probe again with every capability dropped (setpriv), what the chart's security
#      context costs, and lists what it can no longer read;
#   7. prints a summary, with nvidia-smi's view of the same GPUs for comparison.
#
# It needs no network. Everything is bounded in time (under 5 minutes with a carried binary) and
# the script exits non-zero on any failure. Outputs go to ${OUT:-/tmp/gpu-smoke}: summary.txt,
# smoke.log, probe.txt, probe.json, raw.json, compare.txt, watch.jsonl, xid31.jsonl, xid31.txt,
# probe-nocaps.json, nvidia-smi.txt, nvidia-smi-q.txt, nvlink.txt. See docs/nvml.md.
set -euo pipefail
cd "$(dirname "$0")/.."

out_dir=${OUT:-/tmp/gpu-smoke}
watch_seconds=${WATCH_SECONDS:-30}
# Where the driver is: / on a host install, /run/nvidia/driver beside the GPU operator.
driver_root=${GPUHEALTH_DRIVER_ROOT:-/}
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
	timeout 30 nvidia-smi -q -d TEMPERATURE,ECC,PAGE_RETIREMENT,ROW_REMAPPER >"$out_dir/nvidia-smi-q.txt" 2>&1 || true
	timeout 30 nvidia-smi nvlink -s >"$out_dir/nvlink.txt" 2>&1 || true
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
if ! timeout 60 "$bin" probe --driver-root "$driver_root" --output table >"$out_dir/probe.txt" 2>>"$log"; then
	fail "probe --output table exited non-zero (see smoke.log)"
fi
cat "$out_dir/probe.txt" >&2 || true
say "gpuhealth probe (json)"
if ! timeout 60 "$bin" probe --driver-root "$driver_root" --output json >"$out_dir/probe.json" 2>>"$log"; then
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

# 2b. The driver's raw answers.
say "gpuhealth probe --raw"
raw_calls="-"
if timeout 60 "$bin" probe --driver-root "$driver_root" --raw >"$out_dir/raw.json" 2>>"$log"; then
	if command -v jq >/dev/null 2>&1; then
		raw_calls=$(jq '.calls | length' "$out_dir/raw.json" 2>/dev/null || echo "?")
		missing_syms=$(jq -r '[.calls[] | select(.call == "LookupSymbol" and .return != "present") | .args] | join(",")' "$out_dir/raw.json" 2>/dev/null || echo "?")
		say "raw calls: $raw_calls; optional NVML functions missing: ${missing_syms:-none}"
	fi
else
	fail "probe --raw exited non-zero (see smoke.log)"
fi

# 3. probe against nvidia-smi.
compare="$out_dir/compare.txt"
: >"$compare"
if command -v nvidia-smi >/dev/null 2>&1 && command -v jq >/dev/null 2>&1 && [[ -s "$out_dir/probe.json" ]]; then
	# Bus IDs: nvidia-smi writes an 8-digit domain in upper case, NVML's long form the same;
	# compare them lower-cased with the domain cut to 4 digits.
	norm() { tr 'A-F' 'a-f' | sed -E 's/^0*([0-9a-f]{4}):/\1:/' | sort; }
	smi_bus=$(timeout 30 nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader 2>/dev/null | norm || true)
	probe_bus=$(jq -r '.gpus[].device.pciBusID' "$out_dir/probe.json" | norm)
	if [[ "$smi_bus" == "$probe_bus" ]]; then
		echo "bus IDs: same ($(echo "$probe_bus" | tr '\n' ' '))" >>"$compare"
	else
		echo "bus IDs differ: nvidia-smi [$smi_bus] probe [$probe_bus]" >>"$compare"
		fail "probe and nvidia-smi name different PCI bus IDs (see compare.txt)"
	fi
	# Thresholds of GPU 0: nvidia-smi -q's "GPU Slowdown Temp" and "GPU Shutdown Temp".
	smi_slow=$(grep -m1 'GPU Slowdown Temp' "$out_dir/nvidia-smi-q.txt" | grep -oE '[0-9]+' | head -1 || true)
	smi_shut=$(grep -m1 'GPU Shutdown Temp' "$out_dir/nvidia-smi-q.txt" | grep -oE '[0-9]+' | head -1 || true)
	probe_slow=$(jq -r '.gpus[0].readings.temperature.slowdownC // empty' "$out_dir/probe.json")
	probe_shut=$(jq -r '.gpus[0].readings.temperature.shutdownC // empty' "$out_dir/probe.json")
	echo "GPU 0 thresholds: nvidia-smi slowdown=${smi_slow:-n/a} shutdown=${smi_shut:-n/a}; probe slowdown=${probe_slow:-n/a} shutdown=${probe_shut:-n/a}" >>"$compare"
	if [[ -n "$smi_slow" && "$smi_slow" != "${probe_slow:-}" ]] || [[ -n "$smi_shut" && "$smi_shut" != "${probe_shut:-}" ]]; then
		fail "probe's temperature thresholds differ from nvidia-smi's (see compare.txt)"
	fi
	# NVLinks: nvidia-smi nvlink -s prints "Link N: <speed>" for active links and "inactive"
	# otherwise; probe counts a link only when it was active at the first scan.
	smi_active=$(grep -cE 'Link [0-9]+: [0-9.]+ GB/s' "$out_dir/nvlink.txt" || true)
	smi_inactive=$(grep -ciE 'Link [0-9]+: .*inactive' "$out_dir/nvlink.txt" || true)
	probe_links=$(jq '[.gpus[].readings.nvlinks // [] | .[]] | length' "$out_dir/probe.json")
	probe_down=$(jq '[.gpus[].readings.nvlinks // [] | .[] | select(.down)] | length' "$out_dir/probe.json")
	echo "NVLinks: nvidia-smi active=$smi_active inactive=$smi_inactive; probe tracked=$probe_links down=$probe_down" >>"$compare"
	if [[ "$probe_down" -gt 0 ]]; then
		fail "probe reports $probe_down NVLinks down on a machine at rest (see compare.txt)"
	fi
	if [[ "$probe_links" -ne "$smi_active" ]]; then
		fail "probe tracks $probe_links NVLinks, nvidia-smi shows $smi_active active (see compare.txt)"
	fi
else
	echo "skipped: needs nvidia-smi, jq and probe.json" >>"$compare"
fi
sed 's/^/  /' "$compare" >&2

# 4. watch for a while, then SIGINT; it must stop by itself within 15 s, having printed nothing
#    on a healthy idle GPU.
say "gpuhealth watch --backend nvml for ${watch_seconds}s"
set +e
timeout --preserve-status -s INT -k 15 "$watch_seconds" \
	"$bin" watch --backend nvml --driver-root "$driver_root" --output json >"$out_dir/watch.jsonl" 2>>"$log"
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

if [[ "$transitions" -gt 0 ]]; then
	fail "watch printed $transitions transitions on an idle GPU (see watch.jsonl)"
fi

# 5. One real XID 31, seen through NVML.
xid31_result="skipped"
xid31_bin=${XID31_BIN:-bin/xid31}
if [[ ! -x "$xid31_bin" ]] && command -v cc >/dev/null 2>&1; then
	mkdir -p "$(dirname "$xid31_bin")"
	cc -O2 -o "$xid31_bin" hack/gpu-smoke/xid31.c -ldl >>"$log" 2>&1 || say "building xid31 failed (see smoke.log)"
fi
if [[ -x "$xid31_bin" ]]; then
	cfg="$out_dir/xid31-config.yaml"
	printf '%s\n' "apiVersion: gpuhealth.dev/v1alpha1" "kind: HealthConfig" "xids:" "  overrides:" \
		"    - xids: [31]" "      severity: Degraded" >"$cfg"
	say "provoking XID 31 on GPU 0 while watching with XID 31 made Degraded"
	"$bin" watch --backend nvml --driver-root "$driver_root" --output json --config "$cfg" >"$out_dir/xid31.jsonl" 2>>"$log" &
	watch_pid=$!
	sleep 3
	set +e
	timeout 60 "$xid31_bin" >"$out_dir/xid31.txt" 2>&1
	xid31_rc=$?
	set -e
	sleep 5
	kill -INT "$watch_pid" 2>/dev/null || true
	wait "$watch_pid" 2>/dev/null || true
	(dmesg 2>/dev/null | grep -E 'NVRM: Xid .*: 31,' | tail -3 >>"$out_dir/xid31.txt") || true
	case $xid31_rc in
	0)
		if grep -q '"reason":"XID31"' "$out_dir/xid31.jsonl"; then
			xid31_result="seen (Healthy under the default policy, Degraded under the override)"
		else
			xid31_result="NOT seen"
			fail "the kernel faulted but watch saw no XID 31 (see xid31.jsonl, xid31.txt)"
		fi
		;;
	2) xid31_result="skipped: the CUDA driver API is not usable here (see xid31.txt)" ;;
	*)
		xid31_result="the kernel did not fault"
		fail "xid31 did not fault (see xid31.txt)"
		;;
	esac
else
	xid31_result="skipped: no cc and no bin/xid31"
fi
say "XID 31: $xid31_result"

# 6. probe with every capability dropped, as the chart's securityContext does.
nocaps="-"
if command -v setpriv >/dev/null 2>&1; then
	if timeout 60 setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- \
		"$bin" probe --driver-root "$driver_root" --output json >"$out_dir/probe-nocaps.json" 2>>"$log"; then
		if command -v jq >/dev/null 2>&1 && [[ -s "$out_dir/probe.json" ]]; then
			lost_readings=$(jq -n -r --slurpfile a "$out_dir/probe.json" --slurpfile b "$out_dir/probe-nocaps.json" \
				'([$b[0].gpus[].readings.unsupported // [] | .[]] + [$b[0].gpus[].readings.errors // [] | .[]] | unique)
				 - ([$a[0].gpus[].readings.unsupported // [] | .[]] + [$a[0].gpus[].readings.errors // [] | .[]] | unique) | join("; ")')
			lost_events=$(jq -n -r --slurpfile a "$out_dir/probe.json" --slurpfile b "$out_dir/probe-nocaps.json" \
				'([$a[0].gpus[].events[]] | unique) - ([$b[0].gpus[].events[]] | unique) | join(",")')
			nocaps="readings lost: ${lost_readings:-none}; events lost: ${lost_events:-none}"
		else
			nocaps="ran (see probe-nocaps.json)"
		fi
	else
		nocaps="probe failed without capabilities (see smoke.log)"
	fi
else
	nocaps="skipped: no setpriv"
fi
say "without capabilities: $nocaps"

# 7. Summary.
elapsed=$(($(date +%s) - started))
{
	echo "gpu-smoke summary"
	echo "  GPUs found by probe:        $gpus"
	echo "  lost GPUs:                  $lost"
	echo "  events supported (any GPU): $events"
	echo "  readings unsupported:       ${unsupported:-none}"
	echo "  reading errors:             $read_errors"
	echo "  watch exit status:          $watch_rc (0 = stopped cleanly on SIGINT)"
	echo "  transitions during watch:   $transitions (${watch_seconds}s; 0 expected at rest)"
	echo "  raw NVML calls recorded:    $raw_calls (raw.json)"
	echo "  XID 31:                     $xid31_result"
	echo "  without capabilities:       $nocaps"
	echo "probe vs nvidia-smi:"
	sed 's/^/  /' "$compare"
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
