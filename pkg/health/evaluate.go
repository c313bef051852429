package health

import "time"

// evaluation carries one state change through the device tree and collects transitions. The
// checks it runs live in checks.go, xid.go and recovery.go; the condition bookkeeping they share
// (raise, polled, removal, effective health) in conditions.go.
type evaluation struct {
	t   *Tracker
	now time.Time
	out []Transition
	// restoring is set while a checkpoint is applied: faults that come back from it were
	// recorded in the history when they happened.
	restoring bool
}

// apply hands a signal to the check for its kind.
func (ev *evaluation) apply(ds *deviceState, sig Signal) {
	// Everything but XIDs is a fact about the physical GPU.
	gpu := ds
	if sig.Kind != SignalXID && ds.parent != nil {
		gpu = ds.parent
	}
	switch sig.Kind {
	case SignalXID:
		ev.xid(ds, sig)
	case SignalLost:
		ev.lost(gpu)
	case SignalResetRequired:
		ev.resetRequired(gpu)
	case SignalReset:
		if sig.Inferred {
			ev.inferredReset(gpu)
		} else {
			ev.reset(gpu)
		}
	case SignalECCCounters:
		ev.ecc(gpu, sig)
	case SignalECCStorm:
		ev.eccStorm(gpu)
	case SignalRemappedRows:
		ev.remappedRows(gpu, sig)
	case SignalRetiredPages:
		ev.retiredPages(gpu, sig)
	case SignalTemperature:
		ev.temperature(gpu, sig)
	case SignalClockEvents:
		ev.clockEvents(gpu, sig)
	case SignalPCIeReplays:
		ev.pcieReplays(gpu, sig)
	case SignalNVLinkState:
		ev.nvlinkState(gpu, sig)
	case SignalNVLinkErrors:
		ev.nvlinkErrors(gpu, sig)
	case SignalRecoveryAction:
		ev.recoveryAction(gpu, sig)
	case SignalFabric:
		ev.fabric(gpu, sig)
	case SignalRowRemapHistogram:
		ev.rowRemapHistogram(gpu, sig)
	case SignalSRAMThreshold:
		ev.sramThreshold(gpu, sig)
	case SignalPCIeLink:
		ev.pcieLink(gpu, sig)
	case SignalNVLinkRecoveries:
		ev.nvlinkRecoveries(gpu, sig)
	case SignalSample:
		// Quiet periods were expired before apply; a sample carries nothing else.
	}
}
