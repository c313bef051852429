package nvml

import (
	"context"
	"strings"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// sampleLoop runs a sampling round at once (it sets the counters' baselines) and then every
// sample period until ctx ends, or until the driver went away (a *DriverGoneError) or the MIG
// layout changed (an *InventoryChangedError).
func (b *Backend) sampleLoop(ctx context.Context, sink gpuapi.Sink) error {
	for {
		// While a reset has NVML the round waits; it then reads the GPUs afresh.
		if _, ok := b.gate.enter(ctx); !ok {
			return nil
		}
		// The period runs from the start of a round, so slow reads do not stretch it.
		timer := b.opts.clock.NewTimer(b.opts.samplePeriod)
		now := b.opts.clock.Now()
		b.sampling.begin(now)
		gone := b.checkDriver()
		var changed *InventoryChangedError
		if gone == nil && b.inventoryDue(now) {
			changed = b.checkInventory(now)
		}
		if gone == nil && changed == nil {
			b.sampleAll(sink)
		}
		b.sampling.end()
		b.gate.leave()
		switch {
		case gone != nil:
			timer.Stop()
			return b.driverWentAway(gone, sink)
		case changed != nil:
			timer.Stop()
			b.log.Info("The MIG layout changed: the backend must be opened again", "change", changed.Error())
			return changed
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C():
		}
	}
}

func (b *Backend) sampleAll(sink gpuapi.Sink) {
	for _, g := range b.gpus {
		b.emitReadings(g, b.read(g), sink)
	}
	b.stats.add(func(s *Stats) { s.Rounds++ })
}

// emitReadings turns one round of readings into signals and ends the round with SignalSample.
// A lost GPU gets SignalLost and nothing else, a GPU that needs a reset SignalResetRequired and
// nothing else; readings without data produce no signal.
func (b *Backend) emitReadings(g *gpu, r Readings, sink gpuapi.Sink) {
	base := health.Signal{Device: g.dev.UUID, Time: r.Time}
	b.emitCommandReset(g, base, sink)
	if kind, ok := r.fault(); ok {
		b.log.Info("GPU is broken", "gpu", g.dev.UUID, "signal", kind, "errors", strings.Join(r.Errors, "; "))
		if kind == health.SignalResetRequired {
			g.resetRequired.Store(true) // the sampler's own readings said so: they tell when it is over
		}
		b.reportBroken(g, kind, r.Time, sink)
		return
	}
	if g.resetRequired.Swap(false) {
		// The driver answered ERROR_RESET_REQUIRED and now reads the GPU again: its own evidence
		// that the GPU was reset, which clears what a reset clears (an inferred reset would not).
		b.log.Info("GPU reads again after answering RESET_REQUIRED: the driver says it was reset", "gpu", g.dev.UUID)
		b.stats.add(func(s *Stats) { s.Resets++ })
		sink.Signal(with(base, health.SignalReset))
	}
	if len(r.Errors) > 0 {
		b.stats.add(func(s *Stats) { s.SampleErrors += uint64(len(r.Errors)) })
		b.log.Info("some readings failed", "gpu", g.dev.UUID, "errors", strings.Join(r.Errors, "; "))
	}
	b.markChecks(g, r.checks, sink)
	if r.ECC != nil {
		b.emitECC(g, *r.ECC, base, sink)
	}
	if rr := r.RemappedRows; rr != nil {
		s := with(base, health.SignalRemappedRows)
		s.Pending, s.Failure = rr.Pending, rr.Failure
		sink.Signal(s)
	}
	if p := r.RetiredPagesPending; p != nil {
		s := with(base, health.SignalRetiredPages)
		s.Pending = *p
		sink.Signal(s)
	}
	if t := r.Temperature; t != nil {
		s := with(base, health.SignalTemperature)
		s.Value, s.SlowdownC, s.ShutdownC = t.CurrentC, t.SlowdownC, t.ShutdownC
		sink.Signal(s)
	}
	if c := r.ClockEventReasons; c != nil {
		s := with(base, health.SignalClockEvents)
		s.Reasons = *c
		sink.Signal(s)
	}
	if p := r.PCIeReplays; p != nil {
		s := with(base, health.SignalPCIeReplays)
		s.Value = *p
		sink.Signal(s)
	}
	b.emitEarlyWarnings(r, base, sink)
	for _, l := range r.NVLinks {
		s := with(base, health.SignalNVLinkState)
		s.Link, s.Down = uint32(l.Link), l.Down
		sink.Signal(s)
		if l.Errors != nil {
			s := with(base, health.SignalNVLinkErrors)
			s.Link, s.Value = uint32(l.Link), int64(min(*l.Errors, 1<<63-1))
			sink.Signal(s)
		}
	}
	for _, rc := range r.NVLinkRecoveries {
		s := with(base, health.SignalNVLinkRecoveries)
		s.Link, s.Value = uint32(rc.Link), int64(rc.Successful+rc.Failed) // each at most MaxPlausibleNVLinkRecoveries
		sink.Signal(s)
	}
	if a := r.RecoveryAction; a != nil {
		s := with(base, health.SignalRecoveryAction)
		s.Action = *a
		sink.Signal(s)
	}
	sink.Signal(with(base, health.SignalSample))
}

// emitEarlyWarnings passes on the row remapper histogram, the SRAM ECC status, the PCIe link
// and the fabric state.
func (b *Backend) emitEarlyWarnings(r Readings, base health.Signal, sink gpuapi.Sink) {
	if h := r.RowRemapHistogram; h != nil {
		s := with(base, health.SignalRowRemapHistogram)
		s.BanksLow, s.BanksNone = h.Low, h.None
		sink.Signal(s)
	}
	if st := r.SRAM; st != nil {
		s := with(base, health.SignalSRAMThreshold)
		s.Failure = st.ThresholdExceeded
		sink.Signal(s)
	}
	if l := r.PCIeLink; l != nil {
		s := with(base, health.SignalPCIeLink)
		// Each at most MaxPlausiblePCIeLink: readPCIeLink dropped the rest.
		s.PCIe = health.PCIeLinkReading{Gen: uint8(l.Gen), MaxGen: uint8(l.MaxGen), Width: uint8(l.Width), MaxWidth: uint8(l.MaxWidth)}
		sink.Signal(s)
	}
	if f := r.Fabric; f != nil {
		s := with(base, health.SignalFabric)
		s.Fabric = f.health()
		sink.Signal(s)
	}
}

// markChecks tells the sink (when it is a CheckSink) of the checks whose state changed this
// round: one that cannot run (NOT_SUPPORTED, a reading not believed) is not running on the GPU
// and its MIG devices until a reading is taken again. The checks Open found off are announced
// by announce and never change.
func (b *Backend) markChecks(g *gpu, checks []checkState, sink gpuapi.Sink) {
	cs, ok := sink.(CheckSink)
	if !ok {
		return
	}
	for _, c := range checks {
		if g.checksOff[c.check] == c.off {
			continue
		}
		if g.checksOff == nil {
			g.checksOff = map[health.Check]bool{}
		}
		g.checksOff[c.check] = c.off
		if c.off {
			b.log.Info("check not running on this GPU: no data", "gpu", g.dev.UUID, "check", c.check)
		} else {
			b.log.Info("check running again on this GPU", "gpu", g.dev.UUID, "check", c.check)
		}
		cs.SetCheckUnmonitored(g.dev.UUID, c.check, c.off)
		for _, m := range g.migs {
			cs.SetCheckUnmonitored(m.UUID, c.check, c.off)
		}
	}
}

// eccNearZero is how many corrected errors volatile totals may show just after a reset (they
// count again at once on a GPU with a weak cell): lower totals above it are no reset.
const eccNearZero = 16

// emitECC passes the volatile ECC totals on. Volatile counters restart only at a GPU reset (or a
// driver reload), so totals that went back to (near) zero are taken as a reset: an inferred one
// (health.Signal.Inferred), reported first so that the library restarts its rates and clears the
// uncorrected-ECC condition before it sees the new totals, and which clears nothing else (XIDs,
// a required reset: those wait for a reset someone reports). One lower read is not believed on its
// own: the totals are read again. A glitch (the second read back where the totals were), totals
// lower but not near zero (40 → 39: no reset does that) and totals that cannot be read again are
// counted in Stats().Glitches and logged, and are no reset.
func (b *Backend) emitECC(g *gpu, e ECCReading, base health.Signal, sink gpuapi.Sink) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lower := func(e ECCReading) bool {
		return g.eccValid && (e.Corrected < g.ecc.corrected || e.Uncorrected < g.ecc.uncorrected)
	}
	if lower(e) {
		var again Readings
		if err := b.readECC(g, reader{&again}); err != nil || again.ECC == nil {
			b.log.Info("volatile ECC totals read lower and could not be read again: not taken as a reset", "gpu", g.dev.UUID,
				"corrected", e.Corrected, "previousCorrected", g.ecc.corrected, "uncorrected", e.Uncorrected, "previousUncorrected", g.ecc.uncorrected)
			return
		}
		first, now := e, *again.ECC
		e = now
		totals := []any{"gpu", g.dev.UUID, "corrected", now.Corrected, "previousCorrected", g.ecc.corrected,
			"uncorrected", now.Uncorrected, "previousUncorrected", g.ecc.uncorrected}
		switch {
		case !lower(now):
			b.log.Info("volatile ECC totals read lower once, then back: a glitch, not a reset", "gpu", g.dev.UUID,
				"glitchCorrected", first.Corrected, "glitchUncorrected", first.Uncorrected, "corrected", now.Corrected, "uncorrected", now.Uncorrected)
			b.stats.add(func(s *Stats) { s.Glitches++ })
		case now.Uncorrected != 0 || now.Corrected > eccNearZero:
			b.log.Info("volatile ECC totals went down but not back to zero: no reset does that, not taken as one", totals...)
			b.stats.add(func(s *Stats) { s.Glitches++ })
		default:
			b.log.Info("volatile ECC totals went back to zero: the GPU was reset (inferred: clears only the uncorrected-ECC condition)", totals...)
			b.stats.add(func(s *Stats) { s.Resets++ })
			reset := with(base, health.SignalReset)
			reset.Inferred = true
			sink.Signal(reset)
		}
	}
	g.ecc, g.eccValid = eccTotals{corrected: e.Corrected, uncorrected: e.Uncorrected}, true
	s := with(base, health.SignalECCCounters)
	s.Corrected, s.Uncorrected = e.Corrected, e.Uncorrected
	sink.Signal(s)
}

func with(base health.Signal, kind health.SignalKind) health.Signal {
	base.Kind = kind
	return base
}
