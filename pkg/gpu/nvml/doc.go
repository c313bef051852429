// Package nvml is the NVML backend: it watches real NVIDIA GPUs through go-nvml and reports what
// it learns as the health library's signals. It is the only package in the tree that imports
// github.com/NVIDIA/go-nvml (a depguard rule in .golangci.yml enforces it), and so the one place
// that turns an nvml.Return into a Go error.
//
// A Backend has two loops that call NVML, both owned by Run and stopped when its context ends:
//
//   - the event loop waits on one NVML event set for XID critical errors, single- and double-bit
//     ECC errors, single-bit ECC storms, DRAM retirement events and failures, "GPU unavailable" and
//     GPU recovery-action events, and maps each to the GPU (and, for MIG, the GPU instance and
//     compute instance) it concerns. It registers each GPU type by type where a GPU refuses its
//     whole mask, retries at start, and makes the set anew after ERROR_UNKNOWN or to leave a lost
//     GPU out;
//   - the sampler reads every GPU's counters and states each sample period (default 10 s):
//     volatile ECC totals, remapped rows, retired pages, temperature and the GPU's own
//     slowdown/shutdown thresholds, clock-event reasons, the PCIe replay counter, NVLink state and
//     error counters (of the links active when first scanned, or when Fabric Manager has
//     registered the GPU), and NVML's GPU recovery action, and ends each GPU's round with a
//     sample signal.
//
// A GPU reset needs the GPU free of every NVML client, this backend included: CommandResetter
// parks both loops, frees the event set and shuts NVML down around the reset command, then
// initialises NVML again, takes fresh handles by UUID and has the event loop make its set anew
// (session.go, gate.go). When Init fails then, a third goroutine of Run retries it with backoff.
//
// ERROR_NOT_SUPPORTED always means "no data": a reading a GPU does not support produces no signal,
// and a GPU whose events cannot be registered is reported as unmonitored (visible, not unhealthy).
// A check that cannot run at all on a GPU (ECC disabled, MIG mode, or a function the driver's
// libnvidia-ml lacks) is reported as not running through the optional CheckSink, and logged once
// at Open. Open looks every optional NVML function up first: go-nvml binds symbols lazily, and
// calling a missing one would end the process. ERROR_GPU_IS_LOST and ERROR_RESET_REQUIRED, from
// any call, say the GPU itself is broken: SignalLost and SignalResetRequired; when NVML does not
// say which GPU, each is asked for its temperature, which touches the hardware (NVML may still
// serve a lost GPU's UUID). Counters are passed on as totals; the library turns them into rates. A
// volatile ECC total that goes down means the GPU was reset, and the backend reports the reset
// before the new totals. See docs/nvml.md.
//
// Errors returned by this package wrap the nvml.Return that caused them, so
// errors.Is(err, nvml.ERROR_GPU_IS_LOST) works.
package nvml
