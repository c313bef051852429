package health

import "time"

// evaluation carries one state change through the device tree and collects transitions.
type evaluation struct {
	t   *Tracker
	now time.Time
	out []Transition
}

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
		lost := ev.t.policy.Lost
		ev.raise(gpu, raiseSpec{
			Type: ConditionGPULost, Severity: lost.Severity, ClearsOn: lost.ClearsOn, Evict: lost.Evict,
			RecommendedAction: lost.Action, Reason: "GPULost",
		}, func() string { return "the GPU is lost (fell off the bus or stopped responding)" })
	case SignalResetRequired:
		ev.resetRequired(gpu)
	case SignalReset:
		ev.reset(gpu)
	case SignalECCCounters:
		ev.ecc(gpu, sig)
	case SignalECCStorm:
		if ev.t.policy.ECC.Enabled {
			ev.raise(gpu, raiseSpec{
				Type: ConditionECCCorrectedStorm, Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, Evict: false,
				RecommendedAction: ActionInspect, Reason: "SingleBitECCStorm",
			}, func() string { return "the driver reported a single-bit ECC error storm" })
		}
	case SignalRemappedRows:
		ev.remappedRows(gpu, sig)
	case SignalRetiredPages:
		if ev.t.policy.RetiredPages.Enabled && sig.Pending {
			ev.raise(gpu, raiseSpec{
				Type: ConditionRetiredPagesPending, Severity: Degraded, ClearsOn: ClearsOnGPUReset, Evict: false,
				RecommendedAction: ActionResetGPU, Reason: "RetiredPagesPending",
			}, func() string { return "retired pages are pending and take effect at the next GPU reset" })
		}
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
	case SignalSample:
		// Quiet periods were expired before apply; a sample carries nothing else.
	}
}
