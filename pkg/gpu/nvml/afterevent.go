package nvml

import (
	"fmt"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The readings an event calls for. Each reports a GPU that answers lost or "reset required"
// as such instead of what the event announced.

// emitBroken reports the GPU as broken when the reading ended because it is; it reports whether
// it did.
func (b *Backend) emitBroken(g *gpu, r Readings, base health.Signal, sink gpuapi.Sink) bool {
	kind, ok := r.fault()
	if ok {
		b.reportBroken(g, kind, base.Time, sink)
	}
	return ok
}

// emitRecoveryAction reads and reports NVML's recovery action after an event announced a change.
func (b *Backend) emitRecoveryAction(g *gpu, base health.Signal, sink gpuapi.Sink) {
	var r Readings
	action, ok, _ := b.recoveryAction(g, reader{&r})
	switch {
	case b.emitBroken(g, r, base, sink):
	case ok:
		s := with(base, health.SignalRecoveryAction)
		s.Action = action
		sink.Signal(s)
	default:
		b.countReadErrors(g, r)
	}
}

// emitECCAfterEvent reads the ECC totals after an ECC event. When they cannot be read, a
// double-bit event still reports one uncorrected error.
func (b *Backend) emitECCAfterEvent(g *gpu, doubleBit bool, base health.Signal, sink gpuapi.Sink) {
	var r Readings
	_ = b.readECC(g, reader{&r})
	switch {
	case b.emitBroken(g, r, base, sink):
	case r.ECC != nil:
		e := *r.ECC
		if doubleBit {
			e.Uncorrected = max(e.Uncorrected, 1)
		}
		b.emitECC(g, e, base, sink)
	case doubleBit:
		b.countReadErrors(g, r)
		g.mu.Lock()
		e := g.ecc
		g.mu.Unlock()
		s := with(base, health.SignalECCCounters)
		s.Corrected, s.Uncorrected = e.corrected, max(e.uncorrected, 1)
		sink.Signal(s)
	default:
		b.countReadErrors(g, r)
	}
}

// emitRetirementAfterEvent reads the row remapper (or, on GPUs before Ampere, page retirement)
// after a DRAM retirement event. Ampere and later do not retire pages, so their event never
// falls back to them. When nothing can be read (MIG mode, a failed reading), the event itself is
// reported: a pending retirement on an older GPU, a pending row remap on a newer one, or a
// remap failure.
func (b *Backend) emitRetirementAfterEvent(g *gpu, failure bool, base health.Signal, sink gpuapi.Sink) {
	var r Readings
	rd := reader{&r}
	_ = b.readRemappedRows(g, rd)
	pages := !failure && !g.rowRemapper && r.RemappedRows == nil && !r.Lost && !r.ResetRequired
	if pages {
		_ = b.readRetiredPages(g, rd)
	}
	switch {
	case b.emitBroken(g, r, base, sink):
	case r.RemappedRows != nil:
		s := with(base, health.SignalRemappedRows)
		s.Pending, s.Failure = r.RemappedRows.Pending, r.RemappedRows.Failure || failure
		sink.Signal(s)
	case pages:
		b.countReadErrors(g, r)
		s := with(base, health.SignalRetiredPages)
		s.Pending = r.RetiredPagesPending == nil || *r.RetiredPagesPending
		sink.Signal(s)
	default:
		b.countReadErrors(g, r)
		s := with(base, health.SignalRemappedRows)
		s.Pending, s.Failure = !failure, failure
		sink.Signal(s)
	}
}

func (b *Backend) countReadErrors(g *gpu, r Readings) {
	if len(r.Errors) == 0 {
		return
	}
	b.stats.add(func(s *Stats) { s.SampleErrors += uint64(len(r.Errors)) })
	b.log.Info("reading after an event failed", "gpu", g.dev.UUID, "errors", fmt.Sprint(r.Errors))
}
