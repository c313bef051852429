package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The readings an event calls for. Each reports a GPU that answers lost or "reset required"
// as such instead of what the event announced.

// emitBroken reports the GPU as broken when the reading ended because it is; it reports whether
// it did.
func emitBroken(r Readings, base health.Signal, sink Sink) bool {
	kind, ok := r.fault()
	if ok {
		sink.Signal(with(base, kind))
	}
	return ok
}

// emitRecoveryAction reads and reports NVML's recovery action after an event announced a change.
func (b *Backend) emitRecoveryAction(g *gpu, base health.Signal, sink Sink) {
	var r Readings
	action, ok, _ := b.recoveryAction(g, reader{&r})
	switch {
	case emitBroken(r, base, sink):
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
func (b *Backend) emitECCAfterEvent(g *gpu, doubleBit bool, base health.Signal, sink Sink) {
	var r Readings
	_ = b.readECC(g, reader{&r})
	switch {
	case emitBroken(r, base, sink):
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

// emitRetirementAfterEvent reads the row remapper (or, on older GPUs, page retirement) after a
// DRAM retirement event. When neither can be read, the event itself is reported: a pending
// retirement, or a remap failure.
func (b *Backend) emitRetirementAfterEvent(g *gpu, failure bool, base health.Signal, sink Sink) {
	var r Readings
	rd := reader{&r}
	_ = b.readRemappedRows(g, rd)
	if !failure && r.RemappedRows == nil && !r.Lost && !r.ResetRequired {
		_ = b.readRetiredPages(g, rd)
	}
	switch {
	case emitBroken(r, base, sink):
	case r.RemappedRows != nil:
		s := with(base, health.SignalRemappedRows)
		s.Pending, s.Failure = r.RemappedRows.Pending, r.RemappedRows.Failure || failure
		sink.Signal(s)
	case !failure:
		b.countReadErrors(g, r)
		s := with(base, health.SignalRetiredPages)
		s.Pending = r.RetiredPagesPending == nil || *r.RetiredPagesPending
		sink.Signal(s)
	default:
		b.countReadErrors(g, r)
		s := with(base, health.SignalRemappedRows)
		s.Failure = true
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

// unattributedFault is the signal for a GPU that no longer answers GetUUID: lost, unless NVML
// says it needs a reset.
func unattributedFault(ret nvml.Return) health.SignalKind {
	if kind, ok := faultOf(ret); ok {
		return kind
	}
	return health.SignalLost
}
