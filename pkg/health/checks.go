package health

import (
	"fmt"
	"time"
)

// The conditions the checks raise the same way every time.
var (
	eccUncorrected      = raiseSpec{Type: ConditionECCUncorrected, Severity: Unhealthy, ClearsOn: ClearsOnGPUReset, RecommendedAction: ActionResetGPU, Reason: "UncorrectedECCErrors"}
	eccStorm            = raiseSpec{Type: ConditionECCCorrectedStorm, Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, RecommendedAction: ActionInspect, Reason: "SingleBitECCStorm"}
	rowRemapPending     = raiseSpec{Type: ConditionRowRemapPending, Severity: Degraded, ClearsOn: ClearsOnGPUReset, RecommendedAction: ActionResetGPU, Reason: "RowRemapPending"}
	retiredPagesPending = raiseSpec{Type: ConditionRetiredPagesPending, Severity: Degraded, ClearsOn: ClearsOnGPUReset, RecommendedAction: ActionResetGPU, Reason: "RetiredPagesPending"}
)

// spec is the condition of type t the rule raises, with reason.
func (rule XIDRule) spec(t ConditionType, reason string) raiseSpec {
	return raiseSpec{Type: t, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict, RecommendedAction: rule.Action, Reason: reason}
}

// pollFault applies a sample of a polled check that either finds the fault spec describes or
// finds none (spec's condition heads back to Healthy, after its recovery samples).
func (ev *evaluation) pollFault(gpu *deviceState, fault bool, spec pollSpec, msg func() string) {
	if !fault {
		spec.Severity = Healthy
	}
	ev.polled(gpu, spec, msg)
}

// exceeds says whether rate is past limit: a limit that is NaN (an embedder's policy can set
// one) or a rate that is NaN counts as past it, as the rate checks always had it.
func exceeds(rate, limit float64) bool { return !(rate <= limit) }

// lost applies the backend's word that the GPU is lost, under the policy's rule for it.
func (ev *evaluation) lost(gpu *deviceState) {
	ev.raise(gpu, ev.t.policy.Lost.spec(ConditionGPULost, "GPULost"),
		func() string { return "the GPU is lost (fell off the bus or stopped responding)" })
}

// resetRequired applies the driver's word that the GPU needs a reset (ERROR_RESET_REQUIRED).
func (ev *evaluation) resetRequired(gpu *deviceState) {
	rule := ev.t.policy.ResetRequired
	if rule.Severity == Healthy {
		return
	}
	ev.raise(gpu, rule.spec(ConditionGPUResetRequired, "GPUResetRequired"), func() string {
		return "the driver says the GPU requires a reset before it can be used again (ERROR_RESET_REQUIRED)"
	})
}

// reset applies a GPU reset: volatile counters restart, and conditions that wait for a reset end
// on the GPU and its MIG instances.
func (ev *evaluation) reset(gpu *deviceState) {
	gpu.eccCorrected, gpu.pcie, gpu.nvlink = counterRate{}, counterRate{}, nil
	gpu.fabricPendingSince, gpu.nvlinkRecov = time.Time{}, nil
	gpu.recordRepair(HistoryReset, ev.now)
	// The reset is news even when no condition ends (a GPU whose validation failed has none):
	// its history and what reads it (remediation, the report's counts) change.
	ev.t.generation++
	resetClears := func(c *condState) bool { return c.ClearsOn == ClearsOnGPUReset }
	for _, child := range gpu.children {
		ev.removeIf(child, ReasonGPUReset, resetClears)
	}
	ev.removeIf(gpu, ReasonGPUReset, resetClears)
}

// inferredReset applies a reset concluded from the volatile counters alone (Signal.Inferred):
// the counters' rates restart and the condition the uncorrected count raised clears; everything
// else waits for a reset someone reports.
func (ev *evaluation) inferredReset(gpu *deviceState) {
	gpu.eccCorrected, gpu.pcie, gpu.nvlink = counterRate{}, counterRate{}, nil
	ev.removeIf(gpu, ReasonGPUReset, func(c *condState) bool { return c.Type == ConditionECCUncorrected })
}

// ecc applies a sample of the volatile ECC counters: any uncorrected error calls for a GPU reset,
// and a corrected-error rate above the policy's limit is a storm until a quiet period passes.
func (ev *evaluation) ecc(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ECC.Enabled {
		return
	}
	if sig.Uncorrected > 0 {
		ev.raise(gpu, eccUncorrected, func() string {
			return fmt.Sprintf("%d uncorrected volatile ECC errors since the last GPU reset", sig.Uncorrected)
		})
	}
	if rate, ok := gpu.eccCorrected.perMinute(int64(sig.Corrected), ev.now); ok && rate > p.ECC.CorrectedStormPerMinute {
		ev.raise(gpu, eccStorm, func() string {
			return fmt.Sprintf("corrected ECC error rate %.0f/min is above %.0f/min", rate, p.ECC.CorrectedStormPerMinute)
		})
	}
}

// eccStorm applies the driver's event for a single-bit ECC error storm, the same condition a
// high corrected-error rate raises.
func (ev *evaluation) eccStorm(gpu *deviceState) {
	if !ev.t.policy.ECC.Enabled {
		return
	}
	ev.raise(gpu, eccStorm, func() string { return "the driver reported a single-bit ECC error storm" })
}

// remappedRows applies a reading of the row remapper: a failure lasts while readings show it,
// a pending remap until the GPU reset that applies it.
func (ev *evaluation) remappedRows(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RowRemap.Enabled {
		return
	}
	ev.pollFault(gpu, sig.Failure, pollSpec{
		Type: ConditionRowRemapFailure, Severity: Unhealthy, RecoverySamples: DefaultRecoverySamples,
		RecommendedAction: ActionCheckHardware, Reason: "RowRemapFailure",
	}, func() string { return "row remapping failed: no spare row was left for a bad memory row" })
	if sig.Pending {
		ev.raise(gpu, rowRemapPending, func() string { return "a row remap is pending and takes effect at the next GPU reset" })
	}
}

// retiredPages applies a reading of page retirement: pages pending retirement wait for a GPU
// reset.
func (ev *evaluation) retiredPages(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RetiredPages.Enabled || !sig.Pending {
		return
	}
	ev.raise(gpu, retiredPagesPending, func() string { return "retired pages are pending and take effect at the next GPU reset" })
}

// temperature applies a temperature reading against the slowdown and shutdown thresholds: the
// policy's when it sets them, else the GPU's own from the signal, else the defaults.
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
	spec := pollSpec{Type: ConditionThermal, Severity: Healthy, RecoverySamples: p.Thermal.RecoverySamples, RecommendedAction: ActionCheckCooling}
	threshold, which := shutdown, "shutdown"
	switch {
	case sig.Value >= shutdown:
		spec.Severity, spec.Reason = Unhealthy, "TemperatureAtShutdown"
	case sig.Value >= slowdown:
		spec.Severity, spec.Reason = Degraded, "TemperatureAtSlowdown"
		threshold, which = slowdown, "slowdown"
	}
	ev.polled(gpu, spec, func() string {
		return fmt.Sprintf("temperature %d°C reached the %s threshold %d°C", sig.Value, which, threshold)
	})
}

// clockEvents applies the GPU's clock event reasons; only those the policy selects count.
func (ev *evaluation) clockEvents(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ClockEvents.Enabled {
		return
	}
	active := sig.Reasons & p.ClockEvents.Reasons
	ev.pollFault(gpu, active != 0, pollSpec{
		Type: ConditionClockThrottle, Severity: Degraded, RecoverySamples: p.ClockEvents.RecoverySamples,
		RecommendedAction: ActionCheckCooling, Reason: "ClocksThrottled",
	}, func() string { return "clocks are throttled: " + active.String() })
}

// pcieReplays applies a sample of the PCIe replay counter, as a rate against the policy's limit.
func (ev *evaluation) pcieReplays(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.PCIeReplays.Enabled {
		return
	}
	rate, ok := gpu.pcie.perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	ev.pollFault(gpu, exceeds(rate, p.PCIeReplays.PerMinute), pollSpec{
		Type: ConditionPCIeReplayRate, Severity: Degraded, RecoverySamples: p.PCIeReplays.RecoverySamples,
		RecommendedAction: ActionInspect, Reason: "PCIeReplayRateHigh",
	}, func() string {
		return fmt.Sprintf("PCIe replay rate %.0f/min is above %.0f/min", rate, p.PCIeReplays.PerMinute)
	})
}

// nvlinkState applies a reading of one NVLink's state.
func (ev *evaluation) nvlinkState(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	ev.pollFault(gpu, sig.Down, pollSpec{
		Type: ConditionNVLinkDown, Code: sig.Link, Severity: Unhealthy, RecoverySamples: p.NVLink.RecoverySamples,
		RecommendedAction: ActionResetGPU, Reason: "NVLinkDown",
	}, func() string { return fmt.Sprintf("NVLink %d is down", sig.Link) })
}

// growLinks returns rates, grown to hold link's counter.
func growLinks(rates []counterRate, link uint32) []counterRate {
	if int(link) >= len(rates) {
		rates = append(rates, make([]counterRate, int(link)+1-len(rates))...)
	}
	return rates
}

// nvlinkErrors applies a sample of one NVLink's error counter, as a rate against the policy's
// limit.
func (ev *evaluation) nvlinkErrors(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	gpu.nvlink = growLinks(gpu.nvlink, sig.Link)
	rate, ok := gpu.nvlink[sig.Link].perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	ev.pollFault(gpu, exceeds(rate, p.NVLink.ErrorsPerMinute), pollSpec{
		Type: ConditionNVLinkErrorRate, Code: sig.Link, Severity: Degraded, RecoverySamples: p.NVLink.RecoverySamples,
		RecommendedAction: ActionInspect, Reason: "NVLinkErrorRateHigh",
	}, func() string {
		return fmt.Sprintf("NVLink %d error rate %.0f/min is above %.0f/min", sig.Link, rate, p.NVLink.ErrorsPerMinute)
	})
}
