package sim

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// One simulated GPU's readings: how the scenario's events change them, and the sampling rounds
// that read them as the NVML sampler would.

// gpuState is what NVML would report for one simulated GPU.
type gpuState struct {
	// missing: the GPU is on the bus but the driver answers nothing for it; it is never sampled.
	missing      bool
	uuid         string
	migUUIDs     []string
	lost         bool
	corrected    uint64
	uncorrected  uint64
	rowsPending  bool
	rowsFailure  bool
	pagesPending bool
	temperature  int64
	clockReasons health.ClockEventReasons
	pcieReplays  int64
	linkDown     [MaxNVLinks]bool
	linkErrors   [MaxNVLinks]int64
	linksSeen    uint32 // bit set of links the scenario uses; only those are sampled
	recovery     health.RecoveryAction
	// The early warnings, sampled only on a GPU the scenario gives such an event (seen): the
	// fabric registration, the row remapper's banks with few and no spare rows, the SRAM ECC
	// threshold, the PCIe link, and each link's lifetime recovery count.
	seen           earlySeen
	fabric         health.FabricReading
	banksLow       uint32
	banksNone      uint32
	sramExceeded   bool
	pcie           health.PCIeLinkReading
	recoveries     [MaxNVLinks]int64
	recoveriesSeen uint32 // bit set of links with a recovery event
}

func (g *gpuState) apply(ev Event, now time.Time, sink gpu.Sink) {
	base := health.Signal{Device: g.uuid, Time: now}
	if g.lost && ev.Kind != EventXID {
		// A lost GPU answers nothing but "lost"; its readings cannot change.
		base.Kind = health.SignalLost
		sink.Signal(base)
		return
	}
	switch ev.Kind {
	case EventXID:
		s := base
		s.Kind, s.XID, s.XIDFlags = health.SignalXID, ev.XID, ev.XIDFlags
		switch {
		case ev.MIG > 0:
			// NVML reports MIG XIDs on the parent with the instance IDs; do the same.
			s.MIGScoped, s.GPUInstance, s.ComputeInstance = true, uint32(ev.MIG), 0
		case ev.GPUInstance != nil:
			s.MIGScoped, s.GPUInstance, s.ComputeInstance = true, *ev.GPUInstance, health.NoInstance
			if ev.ComputeInstance != nil {
				s.ComputeInstance = *ev.ComputeInstance
			}
		}
		sink.Signal(s)
	case EventECC:
		g.corrected += ev.CorrectedIncrease
		g.uncorrected += ev.UncorrectedIncrease
		sink.Signal(g.eccSignal(base))
	case EventRemappedRows:
		if ev.RowsPending != nil {
			g.rowsPending = *ev.RowsPending
		}
		if ev.RowsFailure != nil {
			g.rowsFailure = *ev.RowsFailure
		}
		sink.Signal(g.rowsSignal(base))
	case EventRetiredPages:
		g.pagesPending = ev.PagesPending
		s := base
		s.Kind, s.Pending = health.SignalRetiredPages, g.pagesPending
		sink.Signal(s)
	case EventTemperature:
		g.temperature = ev.TemperatureC
		sink.Signal(g.temperatureSignal(base))
	case EventClockEventReasons:
		g.clockReasons = ev.ClockEventReasons
		s := base
		s.Kind, s.Reasons = health.SignalClockEvents, g.clockReasons
		sink.Signal(s)
	case EventPCIeReplays:
		// Polled only: the next sampling round reports the new total.
		g.pcieReplays += ev.PCIeReplaysIncrease
	case EventNVLink:
		if ev.LinkDown == nil {
			// Polled only: the next sampling round reports the new total.
			g.linkErrors[ev.Link] += ev.LinkErrorsIncrease
			return
		}
		g.linkDown[ev.Link] = *ev.LinkDown
		s := base
		s.Kind, s.Link, s.Down = health.SignalNVLinkState, ev.Link, g.linkDown[ev.Link]
		sink.Signal(s)
	case EventRecoveryAction:
		g.recovery = ev.RecoveryAction
		s := base
		s.Kind, s.Action = health.SignalRecoveryAction, g.recovery
		sink.Signal(s)
	case EventFabric, EventRowRemapHistogram, EventSRAM, EventPCIeLink, EventNVLinkRecoveries:
		g.applyEarlyWarning(ev, base, sink)
	case EventLost:
		g.lost = true
		base.Kind = health.SignalLost
		sink.Signal(base)
	case EventReset:
		// A reset clears volatile counters, applies pending remaps and retirements, retrains
		// NVLinks and satisfies the recovery action. It cannot bring back a lost GPU, and a
		// remapper failure is permanent.
		g.corrected, g.uncorrected = 0, 0
		g.rowsPending, g.pagesPending = false, false
		g.pcieReplays = 0
		g.linkDown, g.linkErrors = [MaxNVLinks]bool{}, [MaxNVLinks]int64{}
		g.recovery = health.RecoveryNone
		base.Kind = health.SignalReset
		sink.Signal(base)
	}
}

func (g *gpuState) reboot() {
	*g = gpuState{uuid: g.uuid, migUUIDs: g.migUUIDs, temperature: IdleTemperatureC, rowsFailure: g.rowsFailure, linksSeen: g.linksSeen,
		seen: g.seen, banksLow: g.banksLow, banksNone: g.banksNone, sramExceeded: g.sramExceeded, recoveriesSeen: g.recoveriesSeen}
	g.idleEarlyWarnings()
}

func (g *gpuState) eccSignal(base health.Signal) health.Signal {
	base.Kind, base.Corrected, base.Uncorrected = health.SignalECCCounters, g.corrected, g.uncorrected
	return base
}

func (g *gpuState) rowsSignal(base health.Signal) health.Signal {
	base.Kind, base.Pending, base.Failure = health.SignalRemappedRows, g.rowsPending, g.rowsFailure
	return base
}

func (g *gpuState) temperatureSignal(base health.Signal) health.Signal {
	base.Kind, base.Value, base.SlowdownC, base.ShutdownC = health.SignalTemperature, g.temperature, SlowdownC, ShutdownC
	return base
}

// sample emits one sampling round, as the NVML sampler would.
func (g *gpuState) sample(now time.Time, sink gpu.Sink) {
	if g.missing {
		return
	}
	base := health.Signal{Device: g.uuid, Time: now}
	if g.lost {
		base.Kind = health.SignalLost
		sink.Signal(base)
		return
	}
	sink.Signal(g.eccSignal(base))
	sink.Signal(g.rowsSignal(base))
	s := base
	s.Kind, s.Pending = health.SignalRetiredPages, g.pagesPending
	sink.Signal(s)
	sink.Signal(g.temperatureSignal(base))
	s = base
	s.Kind, s.Reasons = health.SignalClockEvents, g.clockReasons
	sink.Signal(s)
	s = base
	s.Kind, s.Value = health.SignalPCIeReplays, g.pcieReplays
	sink.Signal(s)
	// In the NVML sampler's order.
	if g.seen.histogram {
		sink.Signal(g.histogramSignal(base))
	}
	if g.seen.sram {
		sink.Signal(g.sramSignal(base))
	}
	if g.seen.pcie {
		sink.Signal(g.pcieSignal(base))
	}
	if g.seen.fabric {
		sink.Signal(g.fabricSignal(base))
	}
	for link := range uint32(MaxNVLinks) {
		if g.linksSeen&(1<<link) == 0 {
			continue
		}
		s = base
		s.Kind, s.Link, s.Down = health.SignalNVLinkState, link, g.linkDown[link]
		sink.Signal(s)
		s.Kind, s.Down, s.Value = health.SignalNVLinkErrors, false, g.linkErrors[link]
		sink.Signal(s)
	}
	for link := range uint32(MaxNVLinks) {
		if g.recoveriesSeen&(1<<link) != 0 {
			s = base
			s.Kind, s.Link, s.Value = health.SignalNVLinkRecoveries, link, g.recoveries[link]
			sink.Signal(s)
		}
	}
	s = base
	s.Kind, s.Action = health.SignalRecoveryAction, g.recovery
	sink.Signal(s)
	base.Kind = health.SignalSample
	sink.Signal(base)
}
