package health

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

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
		ev.raise(gpu, ConditionGPULost, 0, lost.Severity, lost.ClearsOn, lost.Evict, lost.Action, "GPULost",
			func() string { return "the GPU is lost (fell off the bus or stopped responding)" })
	case SignalResetRequired:
		ev.resetRequired(gpu)
	case SignalReset:
		ev.reset(gpu)
	case SignalECCCounters:
		ev.ecc(gpu, sig)
	case SignalECCStorm:
		if ev.t.policy.ECC.Enabled {
			ev.raise(gpu, ConditionECCCorrectedStorm, 0, Degraded, ClearsOnQuietPeriod, false, ActionInspect, "SingleBitECCStorm",
				func() string { return "the driver reported a single-bit ECC error storm" })
		}
	case SignalRemappedRows:
		ev.remappedRows(gpu, sig)
	case SignalRetiredPages:
		if ev.t.policy.RetiredPages.Enabled && sig.Pending {
			ev.raise(gpu, ConditionRetiredPagesPending, 0, Degraded, ClearsOnGPUReset, false, ActionResetGPU, "RetiredPagesPending",
				func() string { return "retired pages are pending and take effect at the next GPU reset" })
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

// resetRequired applies the driver's word that the GPU needs a reset (ERROR_RESET_REQUIRED).
func (ev *evaluation) resetRequired(gpu *deviceState) {
	rule := ev.t.policy.ResetRequired
	if rule.Severity == Healthy {
		return
	}
	ev.raise(gpu, ConditionGPUResetRequired, 0, rule.Severity, rule.ClearsOn, rule.Evict, rule.Action, "GPUResetRequired",
		func() string {
			return "the driver says the GPU requires a reset before it can be used again (ERROR_RESET_REQUIRED)"
		})
}

// reset applies a GPU reset: volatile counters restart, and conditions that wait for a reset end
// on the GPU and its MIG instances.
func (ev *evaluation) reset(gpu *deviceState) {
	gpu.eccCorrected, gpu.pcie, gpu.nvlink = counterRate{}, counterRate{}, nil
	resetClears := func(c *condState) bool { return c.ClearsOn == ClearsOnGPUReset }
	for _, child := range gpu.children {
		ev.removeIf(child, ReasonGPUReset, resetClears)
	}
	ev.removeIf(gpu, ReasonGPUReset, resetClears)
}

// xid applies an XID. An XID scoped to a MIG GPU instance (and possibly a compute instance)
// concerns the matching MIG devices only; an unscoped one concerns the GPU, and through it every
// instance. When no known instance matches, the whole GPU takes the fault: failing safe beats
// losing it.
func (ev *evaluation) xid(ds *deviceState, sig Signal) {
	rule, _ := ev.t.policy.XIDRuleFor(sig.XID)
	if sig.MIGScoped && ds.parent == nil {
		matched := false
		for _, c := range ds.children {
			if c.dev.MIG.GPUInstance != sig.GPUInstance ||
				(sig.ComputeInstance != NoInstance && c.dev.MIG.ComputeInstance != sig.ComputeInstance) {
				continue
			}
			matched = true
			ev.xidOn(c, sig.XID, rule)
		}
		if matched {
			return
		}
	}
	ev.xidOn(ds, sig.XID, rule)
}

func (ev *evaluation) xidOn(ds *deviceState, xid uint32, rule XIDRule) {
	ds.countXID(xid, ev.now)
	if rule.FollowRecoveryAction || rule.Severity == Healthy {
		return
	}
	if i := ds.find(ConditionXID, xid); i >= 0 {
		c := &ds.conds[i]
		c.LastSeen = ev.now
		if c.Severity == rule.Severity && c.ClearsOn == rule.ClearsOn && c.Evict == rule.Evict {
			return
		}
	}
	desc := rule.Description
	if desc == "" {
		desc = "unknown XID"
	}
	ev.replace(ds, condState{Condition: Condition{
		Type: ConditionXID, Code: xid, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: fmt.Sprintf("XID%d", xid), Message: fmt.Sprintf("XID %d: %s", xid, desc),
	}})
}

func (ds *deviceState) countXID(xid uint32, now time.Time) {
	for i := range ds.xids {
		if ds.xids[i].XID == xid {
			ds.xids[i].Count++
			ds.xids[i].LastSeen = now
			return
		}
	}
	ds.xids = append(ds.xids, XIDCount{XID: xid, Count: 1, LastSeen: now})
	slices.SortFunc(ds.xids, func(a, b XIDCount) int { return cmp.Compare(a.XID, b.XID) })
}

func (ev *evaluation) ecc(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ECC.Enabled {
		return
	}
	if sig.Uncorrected > 0 {
		ev.raise(gpu, ConditionECCUncorrected, 0, Unhealthy, ClearsOnGPUReset, false, ActionResetGPU, "UncorrectedECCErrors",
			func() string {
				return fmt.Sprintf("%d uncorrected volatile ECC errors since the last GPU reset", sig.Uncorrected)
			})
	}
	if rate, ok := gpu.eccCorrected.perMinute(int64(sig.Corrected), ev.now); ok && rate > p.ECC.CorrectedStormPerMinute {
		ev.raise(gpu, ConditionECCCorrectedStorm, 0, Degraded, ClearsOnQuietPeriod, false, ActionInspect, "SingleBitECCStorm",
			func() string {
				return fmt.Sprintf("corrected ECC error rate %.0f/min is above %.0f/min", rate, p.ECC.CorrectedStormPerMinute)
			})
	}
}

func (ev *evaluation) remappedRows(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RowRemap.Enabled {
		return
	}
	failure := Healthy
	if sig.Failure {
		failure = Unhealthy
	}
	ev.polled(gpu, ConditionRowRemapFailure, 0, failure, DefaultRecoverySamples, ActionCheckHardware, "RowRemapFailure",
		func() string { return "row remapping failed: no spare row was left for a bad memory row" })
	if sig.Pending {
		ev.raise(gpu, ConditionRowRemapPending, 0, Degraded, ClearsOnGPUReset, false, ActionResetGPU, "RowRemapPending",
			func() string { return "a row remap is pending and takes effect at the next GPU reset" })
	}
}

func (ev *evaluation) temperature(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.Thermal.Enabled {
		return
	}
	slowdown, shutdown := sig.SlowdownC, sig.ShutdownC
	if slowdown <= 0 {
		slowdown = DefaultSlowdownC
	}
	if shutdown <= 0 {
		shutdown = DefaultShutdownC
	}
	if p.Thermal.SlowdownC > 0 {
		slowdown = p.Thermal.SlowdownC
	}
	if p.Thermal.ShutdownC > 0 {
		shutdown = p.Thermal.ShutdownC
	}
	switch {
	case sig.Value >= shutdown:
		ev.polled(gpu, ConditionThermal, 0, Unhealthy, p.Thermal.RecoverySamples, ActionCheckCooling, "TemperatureAtShutdown",
			func() string {
				return fmt.Sprintf("temperature %d°C reached the shutdown threshold %d°C", sig.Value, shutdown)
			})
	case sig.Value >= slowdown:
		ev.polled(gpu, ConditionThermal, 0, Degraded, p.Thermal.RecoverySamples, ActionCheckCooling, "TemperatureAtSlowdown",
			func() string {
				return fmt.Sprintf("temperature %d°C reached the slowdown threshold %d°C", sig.Value, slowdown)
			})
	default:
		ev.polled(gpu, ConditionThermal, 0, Healthy, p.Thermal.RecoverySamples, "", "", nil)
	}
}

func (ev *evaluation) clockEvents(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ClockEvents.Enabled {
		return
	}
	active := sig.Reasons & p.ClockEvents.Reasons
	if active == 0 {
		ev.polled(gpu, ConditionClockThrottle, 0, Healthy, p.ClockEvents.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionClockThrottle, 0, Degraded, p.ClockEvents.RecoverySamples, ActionCheckCooling, "ClocksThrottled",
		func() string { return "clocks are throttled: " + active.String() })
}

func (ev *evaluation) pcieReplays(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.PCIeReplays.Enabled {
		return
	}
	rate, ok := gpu.pcie.perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	if rate <= p.PCIeReplays.PerMinute {
		ev.polled(gpu, ConditionPCIeReplayRate, 0, Healthy, p.PCIeReplays.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionPCIeReplayRate, 0, Degraded, p.PCIeReplays.RecoverySamples, ActionInspect, "PCIeReplayRateHigh",
		func() string {
			return fmt.Sprintf("PCIe replay rate %.0f/min is above %.0f/min", rate, p.PCIeReplays.PerMinute)
		})
}

func (ev *evaluation) nvlinkState(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	if !sig.Down {
		ev.polled(gpu, ConditionNVLinkDown, sig.Link, Healthy, p.NVLink.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionNVLinkDown, sig.Link, Unhealthy, p.NVLink.RecoverySamples, ActionResetGPU, "NVLinkDown",
		func() string { return fmt.Sprintf("NVLink %d is down", sig.Link) })
}

func (ev *evaluation) nvlinkErrors(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	if int(sig.Link) >= len(gpu.nvlink) {
		gpu.nvlink = append(gpu.nvlink, make([]counterRate, int(sig.Link)+1-len(gpu.nvlink))...)
	}
	rate, ok := gpu.nvlink[sig.Link].perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	if rate <= p.NVLink.ErrorsPerMinute {
		ev.polled(gpu, ConditionNVLinkErrorRate, sig.Link, Healthy, p.NVLink.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionNVLinkErrorRate, sig.Link, Degraded, p.NVLink.RecoverySamples, ActionInspect, "NVLinkErrorRateHigh",
		func() string {
			return fmt.Sprintf("NVLink %d error rate %.0f/min is above %.0f/min", sig.Link, rate, p.NVLink.ErrorsPerMinute)
		})
}
