package health

import (
	"fmt"
	"time"
)

// lost applies the backend's word that the GPU is lost, under the policy's rule for it.
func (ev *evaluation) lost(gpu *deviceState) {
	rule := ev.t.policy.Lost
	ev.raise(gpu, raiseSpec{
		Type: ConditionGPULost, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: "GPULost",
	}, func() string { return "the GPU is lost (fell off the bus or stopped responding)" })
}

// resetRequired applies the driver's word that the GPU needs a reset (ERROR_RESET_REQUIRED).
func (ev *evaluation) resetRequired(gpu *deviceState) {
	rule := ev.t.policy.ResetRequired
	if rule.Severity == Healthy {
		return
	}
	ev.raise(gpu, raiseSpec{
		Type: ConditionGPUResetRequired, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: "GPUResetRequired",
	}, func() string {
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
		ev.raise(gpu, raiseSpec{
			Type: ConditionECCUncorrected, Severity: Unhealthy, ClearsOn: ClearsOnGPUReset, Evict: false,
			RecommendedAction: ActionResetGPU, Reason: "UncorrectedECCErrors",
		}, func() string {
			return fmt.Sprintf("%d uncorrected volatile ECC errors since the last GPU reset", sig.Uncorrected)
		})
	}
	if rate, ok := gpu.eccCorrected.perMinute(int64(sig.Corrected), ev.now); ok && rate > p.ECC.CorrectedStormPerMinute {
		ev.raise(gpu, raiseSpec{
			Type: ConditionECCCorrectedStorm, Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, Evict: false,
			RecommendedAction: ActionInspect, Reason: "SingleBitECCStorm",
		}, func() string {
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
	ev.raise(gpu, raiseSpec{
		Type: ConditionECCCorrectedStorm, Severity: Degraded, ClearsOn: ClearsOnQuietPeriod, Evict: false,
		RecommendedAction: ActionInspect, Reason: "SingleBitECCStorm",
	}, func() string { return "the driver reported a single-bit ECC error storm" })
}

// remappedRows applies a reading of the row remapper: a failure lasts while readings show it,
// a pending remap until the GPU reset that applies it.
func (ev *evaluation) remappedRows(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RowRemap.Enabled {
		return
	}
	failure := Healthy
	if sig.Failure {
		failure = Unhealthy
	}
	ev.polled(gpu, pollSpec{
		Type: ConditionRowRemapFailure, Severity: failure, RecoverySamples: DefaultRecoverySamples,
		RecommendedAction: ActionCheckHardware, Reason: "RowRemapFailure",
	}, func() string { return "row remapping failed: no spare row was left for a bad memory row" })
	if sig.Pending {
		ev.raise(gpu, raiseSpec{
			Type: ConditionRowRemapPending, Severity: Degraded, ClearsOn: ClearsOnGPUReset, Evict: false,
			RecommendedAction: ActionResetGPU, Reason: "RowRemapPending",
		}, func() string { return "a row remap is pending and takes effect at the next GPU reset" })
	}
}

// retiredPages applies a reading of page retirement: pages pending retirement wait for a GPU
// reset.
func (ev *evaluation) retiredPages(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RetiredPages.Enabled || !sig.Pending {
		return
	}
	ev.raise(gpu, raiseSpec{
		Type: ConditionRetiredPagesPending, Severity: Degraded, ClearsOn: ClearsOnGPUReset, Evict: false,
		RecommendedAction: ActionResetGPU, Reason: "RetiredPagesPending",
	}, func() string { return "retired pages are pending and take effect at the next GPU reset" })
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
	switch {
	case sig.Value >= shutdown:
		ev.polled(gpu, pollSpec{
			Type: ConditionThermal, Severity: Unhealthy, RecoverySamples: p.Thermal.RecoverySamples,
			RecommendedAction: ActionCheckCooling, Reason: "TemperatureAtShutdown",
		}, func() string {
			return fmt.Sprintf("temperature %d°C reached the shutdown threshold %d°C", sig.Value, shutdown)
		})
	case sig.Value >= slowdown:
		ev.polled(gpu, pollSpec{
			Type: ConditionThermal, Severity: Degraded, RecoverySamples: p.Thermal.RecoverySamples,
			RecommendedAction: ActionCheckCooling, Reason: "TemperatureAtSlowdown",
		}, func() string {
			return fmt.Sprintf("temperature %d°C reached the slowdown threshold %d°C", sig.Value, slowdown)
		})
	default:
		ev.polled(gpu, pollSpec{
			Type: ConditionThermal, Severity: Healthy, RecoverySamples: p.Thermal.RecoverySamples,
		}, nil)
	}
}

// clockEvents applies the GPU's clock event reasons; only those the policy selects count.
func (ev *evaluation) clockEvents(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ClockEvents.Enabled {
		return
	}
	active := sig.Reasons & p.ClockEvents.Reasons
	if active == 0 {
		ev.polled(gpu, pollSpec{
			Type: ConditionClockThrottle, Severity: Healthy, RecoverySamples: p.ClockEvents.RecoverySamples,
		}, nil)
		return
	}
	ev.polled(gpu, pollSpec{
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
	if rate <= p.PCIeReplays.PerMinute {
		ev.polled(gpu, pollSpec{
			Type: ConditionPCIeReplayRate, Severity: Healthy, RecoverySamples: p.PCIeReplays.RecoverySamples,
		}, nil)
		return
	}
	ev.polled(gpu, pollSpec{
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
	if !sig.Down {
		ev.polled(gpu, pollSpec{
			Type: ConditionNVLinkDown, Code: sig.Link, Severity: Healthy, RecoverySamples: p.NVLink.RecoverySamples,
		}, nil)
		return
	}
	ev.polled(gpu, pollSpec{
		Type: ConditionNVLinkDown, Code: sig.Link, Severity: Unhealthy, RecoverySamples: p.NVLink.RecoverySamples,
		RecommendedAction: ActionResetGPU, Reason: "NVLinkDown",
	}, func() string { return fmt.Sprintf("NVLink %d is down", sig.Link) })
}

// nvlinkErrors applies a sample of one NVLink's error counter, as a rate against the policy's

// growLinks returns rates, grown to hold link's counter.
func growLinks(rates []counterRate, link uint32) []counterRate {
	if int(link) >= len(rates) {
		rates = append(rates, make([]counterRate, int(link)+1-len(rates))...)
	}
	return rates
}

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
	if rate <= p.NVLink.ErrorsPerMinute {
		ev.polled(gpu, pollSpec{
			Type: ConditionNVLinkErrorRate, Code: sig.Link, Severity: Healthy, RecoverySamples: p.NVLink.RecoverySamples,
		}, nil)
		return
	}
	ev.polled(gpu, pollSpec{
		Type: ConditionNVLinkErrorRate, Code: sig.Link, Severity: Degraded, RecoverySamples: p.NVLink.RecoverySamples,
		RecommendedAction: ActionInspect, Reason: "NVLinkErrorRateHigh",
	}, func() string {
		return fmt.Sprintf("NVLink %d error rate %.0f/min is above %.0f/min", sig.Link, rate, p.NVLink.ErrorsPerMinute)
	})
}
