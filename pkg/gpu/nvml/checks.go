package nvml

import (
	"fmt"
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// CheckSink is what a gpu.Sink can also do, discovered by type assertion: record that one check
// cannot run on a device. *health.Monitor implements it. Without it, the checks that cannot run
// are only logged (once, at Open) and listed by Probe.
type CheckSink interface {
	SetCheckUnmonitored(uuid string, check health.Check, unmonitored bool)
}

var _ CheckSink = (*health.Monitor)(nil)

// ECC memory errors, as events: they need ECC enabled like the totals do.
const eccEvents = nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccErrorStorm

// setOff records that a reading is not taken on g, and why. Open calls it; afterwards g.off is
// only read.
func (g *gpu) setOff(reading, why string) {
	if g.off == nil {
		g.off = map[string]string{}
	}
	g.off[reading] = why
}

// isOff reports whether a reading is not taken on g.
func (g *gpu) isOff(reading string) bool {
	_, off := g.off[reading]
	return off
}

// noteFault remembers an answer that says the GPU is broken while Open looks at it; Run
// reports it before anything else. Lost wins over a reset: a reset does not bring a lost GPU
// back.
func (g *gpu) noteFault(ret nvml.Return) {
	if kind, ok := faultOf(ret); ok && (g.fault == 0 || kind == health.SignalLost) {
		g.fault = kind
	}
}

// readECCMode reads whether g's ECC is on. The ECC totals and ECC events need it enabled
// (nvml.h: "Requires ECC Mode to be enabled"); without it they answer NOT_SUPPORTED forever,
// which would pass for a GPU without ECC errors. A GPU with ECC off, or without ECC at all
// (GetEccMode answers NOT_SUPPORTED: "Only applicable to devices with ECC"), has its ECC check
// off: reported as not running, never as healthy.
func (b *Backend) readECCMode(g *gpu) {
	if !b.sym.has(symEccMode) || g.isOff(ReadingECC) {
		return // cannot tell: the totals are read and say for themselves
	}
	current, pending, ret := g.handle.GetEccMode()
	g.eccDisabled = (ret == nvml.SUCCESS && current != nvml.FEATURE_ENABLED) || notSupported(ret)
	switch {
	case ret == nvml.SUCCESS && current == nvml.FEATURE_ENABLED:
	case ret == nvml.SUCCESS && pending == nvml.FEATURE_ENABLED:
		g.setOff(ReadingECC, "ECC is disabled on this GPU (enabled from the next reboot)")
	case ret == nvml.SUCCESS:
		g.setOff(ReadingECC, "ECC is disabled on this GPU")
	case notSupported(ret):
		g.setOff(ReadingECC, "the GPU has no ECC memory (GetEccMode answers ERROR_NOT_SUPPORTED)")
	default:
		g.noteFault(ret)
		b.log.Error(nvmlError("reading the ECC mode", ret), "reading the ECC totals anyway", "gpu", g.dev.UUID)
	}
}

// readMIGLimits marks the memory checks that MIG mode stops. With MIG on, nvml.h has
// nvmlDeviceGetRemappedRows answer NOT_SUPPORTED ("If MIG is enabled"), and volatile ECC counts
// cannot be read through the GPU's handle (nvmlDeviceGetMemoryErrorCounter: "Querying volatile
// errors using device handles is currently not supported"). Taken as "no data", they would
// leave the GPU's memory looking healthy for as long as MIG is on; so each that answers so is
// reported as not running, with MIG mode as the reason. Open asks once: MIG mode changes only
// with a GPU reset, and the MIG inventory is taken once too.
func (b *Backend) readMIGLimits(g *gpu) {
	if !g.migEnabled {
		return
	}
	if !g.isOff(ReadingRemappedRows) {
		_, _, _, _, ret := g.handle.GetRemappedRows()
		b.migLimit(g, ReadingRemappedRows, "nvmlDeviceGetRemappedRows", ret)
	}
	if !g.isOff(ReadingECC) {
		_, ret := g.handle.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		b.migLimit(g, ReadingECC, "nvmlDeviceGetTotalEccErrors (volatile)", ret)
	}
}

// migLimit turns a NOT_SUPPORTED answer of a reading on a GPU in MIG mode into a check that
// does not run; any other answer leaves the reading to say for itself each round.
func (b *Backend) migLimit(g *gpu, reading, call string, ret nvml.Return) {
	if notSupported(ret) {
		g.setOff(reading, fmt.Sprintf("MIG mode is on: %s answers ERROR_NOT_SUPPORTED", call))
		return
	}
	g.noteFault(ret)
}

// logOff says once, at Open, which readings cannot be taken: the functions the driver lacks for
// every GPU, then what each GPU cannot do on its own (ECC off, MIG mode).
func (b *Backend) logOff() {
	common := b.sym.readingsOff()
	for _, r := range slices.Sorted(maps.Keys(common)) {
		b.log.Info("check not running on any GPU: the driver is too old", "reading", r, "check", checkOf(r), "why", common[r])
	}
	if b.eventsOff != "" {
		b.log.Info("NVML events cannot be watched: every GPU is unmonitored for events", "why", b.eventsOff)
	}
	for _, g := range b.gpus {
		for _, r := range slices.Sorted(maps.Keys(g.off)) {
			if _, all := common[r]; !all {
				b.log.Info("check not running on this GPU", "gpu", g.dev.UUID, "reading", r, "check", checkOf(r), "why", g.off[r])
			}
		}
	}
}

// announce tells sink, as Run starts, what Open learnt: the checks that cannot run on each GPU
// (and its MIG devices), and the GPUs that were broken already.
func (b *Backend) announce(sink gpuapi.Sink) {
	cs, _ := sink.(CheckSink)
	for _, g := range b.gpus {
		if cs != nil {
			for r := range g.off {
				if c := checkOf(r); c != "" {
					cs.SetCheckUnmonitored(g.dev.UUID, c, true)
					for _, m := range g.migs {
						cs.SetCheckUnmonitored(m.UUID, c, true)
					}
				}
			}
		}
		if g.fault != 0 {
			b.log.Info("GPU was broken when NVML was opened", "gpu", g.dev.UUID, "signal", g.fault)
			b.reportBroken(g, g.fault, b.opts.clock.Now(), sink)
		}
	}
}
