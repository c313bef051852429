package simdriver

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// How a scenario event changes the simulated GPUs (node.go), and the events the driver
// delivers for it.

// apply changes the GPUs as a scenario event says, and queues the events the driver would
// deliver. An unload, or a reset, while processes hold NVML is refused (errInUse). n.mu must be
// held.
func (n *node) apply(ev sim.Event) error {
	if ev.Kind == sim.EventDriver {
		return n.applyDriver(ev)
	}
	if ev.GPU < 0 || ev.GPU >= len(n.gpus) {
		return nil
	}
	g := n.gpus[ev.GPU]
	if ev.Kind == sim.EventReset {
		if pids := n.holders(); len(pids) > 0 {
			return errInUse{"reset", pids}
		}
	}
	wire := uint32(ev.GPU * migSlots)
	for range max(ev.Repeat, 1) {
		n.applyOnce(g, wire, ev)
	}
	return nil
}

// applyDriver unloads the driver, unless processes hold it, or loads it again.
func (n *node) applyDriver(ev sim.Event) error {
	switch ev.DriverAction {
	case sim.DriverUnload:
		if pids := n.holders(); len(pids) > 0 {
			return errInUse{"unload", pids}
		}
		n.unloaded = true
		n.log("The driver is unloaded: nvmlInit answers DRIVER_NOT_LOADED until it is loaded again")
	case sim.DriverLoad:
		n.unloaded = false
		n.log("The driver is loaded")
	}
	return nil
}

// applyOnce applies one occurrence of ev to GPU g (wire is its wire number): the faults the
// driver delivers an event for here, every other change of a reading in g.applyReading.
func (n *node) applyOnce(g *gpuState, wire uint32, ev sim.Event) {
	switch ev.Kind {
	case sim.EventXID:
		e := event{dev: wire, typ: eventXID, data: uint64(ev.XID), gpuInst: noInstance, ciInst: noInstance}
		switch {
		case ev.MIG > 0:
			e.gpuInst, e.ciInst = uint32(ev.MIG), 0
		case ev.GPUInstance != nil:
			e.gpuInst = *ev.GPUInstance
			if ev.ComputeInstance != nil {
				e.ciInst = *ev.ComputeInstance
			}
		}
		n.deliver(e)
	case sim.EventECC:
		if g.lost {
			return
		}
		g.corrected += ev.CorrectedIncrease
		g.aggCorrected += ev.CorrectedIncrease
		g.uncorrected += ev.UncorrectedIncrease
		g.aggUncorr += ev.UncorrectedIncrease
		if ev.UncorrectedIncrease > 0 {
			n.deliver(event{dev: wire, typ: eventDoubleBitECC, gpuInst: noInstance, ciInst: noInstance})
		}
	case sim.EventRemappedRows:
		n.applyRemappedRows(g, wire, ev)
	case sim.EventRecoveryAction:
		g.recovery = ev.RecoveryAction
		n.deliver(event{dev: wire, typ: eventRecoveryAction, data: uint64(ev.RecoveryAction), gpuInst: noInstance, ciInst: noInstance})
	case sim.EventLost:
		if !g.lost {
			g.lost = true
			n.deliver(event{dev: wire, typ: eventGPUUnavailable, gpuInst: noInstance, ciInst: noInstance})
		}
	case sim.EventReset:
		n.reset(g)
	case sim.EventMIG:
		n.setMIG(g, ev.GPU, ev.MIGCount)
		n.deliver(event{dev: wire, typ: eventMIGConfigChange, gpuInst: noInstance, ciInst: noInstance})
	default:
		g.applyReading(ev)
	}
}

// applyRemappedRows sets the row remapper's flags; a row newly pending, and a remapping failure,
// are events of the driver's.
func (n *node) applyRemappedRows(g *gpuState, wire uint32, ev sim.Event) {
	if ev.RowsPending != nil {
		g.rowsPending = *ev.RowsPending
		if g.rowsPending {
			g.rowsUncor++
			n.deliver(event{dev: wire, typ: eventDRAMRetirement, gpuInst: noInstance, ciInst: noInstance})
		}
	}
	if ev.RowsFailure != nil {
		g.rowsFailure = *ev.RowsFailure
		if g.rowsFailure {
			n.deliver(event{dev: wire, typ: eventDRAMRetireFailure, gpuInst: noInstance, ciInst: noInstance})
		}
	}
}

// applyReading changes the readings of the events the driver delivers nothing for: they show
// only when a consumer reads them.
func (g *gpuState) applyReading(ev sim.Event) {
	switch ev.Kind {
	case sim.EventRetiredPages:
		g.pagesPending = ev.PagesPending
	case sim.EventTemperature:
		g.temperature = ev.TemperatureC
	case sim.EventClockEventReasons:
		g.clockReasons = uint64(ev.ClockEventReasons)
	case sim.EventPCIeReplays:
		g.pcieReplays += uint32(ev.PCIeReplaysIncrease)
	case sim.EventNVLink:
		l := g.link(ev.Link)
		if ev.LinkDown != nil {
			l.down = *ev.LinkDown
		} else {
			l.crc += uint64(ev.LinkErrorsIncrease)
		}
	case sim.EventHang:
		g.hangUntil = time.Now().Add(ev.Hang)
	case sim.EventOutOfRange:
		g.outOfRange[ev.Reading] = true
	case sim.EventReadsLower:
		g.readsLower[ev.Reading] = true
	case sim.EventFabric:
		g.fabric = uint64(ev.Fabric.State) // NVML_GPU_FABRIC_STATE_*, as health.FabricState numbers them
		g.fabricStatus, g.fabricHealth = ev.Fabric.Status, ev.Fabric
	case sim.EventRowRemapHistogram:
		g.banksLow, g.banksNone = ev.BanksLow, ev.BanksNone
	case sim.EventSRAM:
		g.sramExceeded = ev.SRAMThresholdExceeded
	case sim.EventPCIeLink:
		for _, f := range [...]struct{ from, into *uint8 }{
			{&ev.PCIeLink.Gen, &g.pcie.Gen}, {&ev.PCIeLink.MaxGen, &g.pcie.MaxGen},
			{&ev.PCIeLink.Width, &g.pcie.Width}, {&ev.PCIeLink.MaxWidth, &g.pcie.MaxWidth},
		} {
			if *f.from != 0 {
				*f.into = *f.from
			}
		}
	case sim.EventNVLinkRecoveries:
		l := g.link(ev.Link)
		l.recovered += ev.RecoveriesSuccessful
		l.failed += ev.RecoveriesFailed
	case sim.EventDiag, sim.EventLatent:
		g.diag = g.diag.Apply(ev)
	}
}

// link returns the GPU's link l, which a scenario event that names it brings into being.
func (g *gpuState) link(l uint32) *linkState {
	if g.links[l] == nil {
		g.links[l] = &linkState{}
	}
	return g.links[l]
}
