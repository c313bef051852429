package health

import (
	"fmt"
	"time"
)

// The checks on the NVLink fabric and the early warnings: readings that say a GPU is running
// out of spares or margin before it fails. Every condition here is polled: it clears once the
// reading is back (after the check's recovery samples, where it has any).

// fabric judges the GPU's fabric registration and the fabric's health: a registration that
// completed with a failure is Unhealthy (Azure/azhpc-images#506: nodes that passed checks with
// State=Completed and a failed status caused repeated incidents); one that has not completed
// RegistrationTimeout after it was first read, and a fabric whose health mask says the bandwidth
// is degraded or a route is unhealthy, are Degraded.
func (ev *evaluation) fabric(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.Fabric.Enabled || sig.Fabric.State == FabricNotSupported {
		return
	}
	f := sig.Fabric
	reg := pollSpec{Type: ConditionFabricRegistration, RecoverySamples: 1, RecommendedAction: ActionInspect}
	switch {
	case f.State == FabricCompleted && f.Status != 0:
		gpu.fabricPendingSince = time.Time{}
		reg.Severity, reg.Reason = Unhealthy, "FabricRegistrationFailed"
		ev.polled(gpu, reg, func() string {
			return fmt.Sprintf("the NVLink fabric registration completed with error %d: the GPU cannot reach its peers (check Fabric Manager)", f.Status)
		})
	case f.State == FabricCompleted:
		gpu.fabricPendingSince = time.Time{}
		reg.Severity = Healthy
		ev.polled(gpu, reg, nil)
	default:
		if gpu.fabricPendingSince.IsZero() || ev.now.Before(gpu.fabricPendingSince) {
			gpu.fabricPendingSince = ev.now
		}
		if waited := ev.now.Sub(gpu.fabricPendingSince); waited >= p.Fabric.RegistrationTimeout {
			reg.Severity, reg.Reason = Degraded, "FabricRegistrationPending"
			ev.polled(gpu, reg, func() string {
				return fmt.Sprintf("the NVLink fabric registration has not completed in %v (state %d): Fabric Manager may be down", waited.Round(time.Second), f.State)
			})
		}
	}
	hs := pollSpec{Type: ConditionFabricHealth, RecoverySamples: 1, RecommendedAction: ActionInspect}
	switch {
	case f.RouteUnhealthy:
		hs.Severity, hs.Reason = Degraded, "FabricRouteUnhealthy"
	case f.DegradedBandwidth:
		hs.Severity, hs.Reason = Degraded, "FabricBandwidthDegraded"
	}
	ev.polled(gpu, hs, func() string {
		return fmt.Sprintf("the NVLink fabric's health mask says: %s (route recovery %t, access-timeout recovery %t)",
			hs.Reason, f.RouteRecovery, f.AccessTimeoutRecovery)
	})
}

// rowRemapHistogram warns when the row remapper's banks run out of spare rows: a bank with none
// left cannot remap the next failing row, which then needs the GPU replaced.
func (ev *evaluation) rowRemapHistogram(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RowRemapHistogram.Enabled {
		return
	}
	r := pollSpec{Type: ConditionRowRemapAvailability, RecoverySamples: 1, RecommendedAction: ActionReplaceSoon}
	switch {
	case sig.BanksNone > 0:
		r.Severity, r.Reason = Degraded, "RowRemapAvailabilityNone"
	case sig.BanksLow > 0:
		r.Severity, r.Reason = Degraded, "RowRemapAvailabilityLow"
	}
	ev.polled(gpu, r, func() string {
		return fmt.Sprintf("row remapper: %d banks have no spare rows left and %d only a few", sig.BanksNone, sig.BanksLow)
	})
}

// sramThreshold warns when the SRAM ECC errors passed the driver's threshold: NVIDIA's guidance
// after XID 48 is to check this, and a GPU past it is to be replaced.
func (ev *evaluation) sramThreshold(gpu *deviceState, sig Signal) {
	if !ev.t.policy.SRAM.Enabled {
		return
	}
	r := pollSpec{Type: ConditionSRAMThreshold, RecoverySamples: 1, RecommendedAction: ActionReplaceSoon}
	if sig.Failure {
		r.Severity, r.Reason = Degraded, "SRAMECCThresholdExceeded"
	}
	ev.polled(gpu, r, func() string { return "SRAM ECC errors exceeded the driver's threshold" })
}

// pcieLink warns when the PCIe link trained narrower (or, with Generation, slower) than it can:
// a bad riser, slot or cable costs bandwidth without any error.
func (ev *evaluation) pcieLink(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.PCIeLink.Enabled {
		return
	}
	l := sig.PCIe
	narrow := l.Width > 0 && l.MaxWidth > 0 && l.Width < l.MaxWidth
	slow := p.PCIeLink.Generation && l.Gen > 0 && l.MaxGen > 0 && l.Gen < l.MaxGen
	r := pollSpec{Type: ConditionPCIeLinkDegraded, RecoverySamples: p.PCIeLink.RecoverySamples, RecommendedAction: ActionInspect}
	if narrow || slow {
		r.Severity, r.Reason = Degraded, "PCIeLinkDegraded"
	}
	ev.polled(gpu, r, func() string {
		return fmt.Sprintf("PCIe link trained at gen %d x%d, the most it can is gen %d x%d", l.Gen, l.Width, l.MaxGen, l.MaxWidth)
	})
}

// nvlinkRecoveryWindow is the span over which a link's recoveries are counted.
const nvlinkRecoveryWindow = time.Hour

// nvlinkRecoveries warns when a link's lifetime recovery count rises by PerHour or more within
// an hour: links that keep recovering fail days later (marin-community/marin#9086).
func (ev *evaluation) nvlinkRecoveries(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLinkRecoveries.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	gpu.nvlinkRecov = growLinks(gpu.nvlinkRecov, sig.Link)
	w := &gpu.nvlinkRecov[sig.Link]
	if !w.valid || sig.Value < w.base || ev.now.Before(w.at) {
		*w = counterRate{base: sig.Value, at: ev.now, valid: true}
		return
	}
	rise, elapsed := float64(sig.Value-w.base), ev.now.Sub(w.at)
	r := pollSpec{Type: ConditionNVLinkRecoveries, Code: sig.Link, RecoverySamples: 1, RecommendedAction: ActionInspect}
	switch {
	case rise >= p.NVLinkRecoveries.PerHour:
		r.Severity, r.Reason = Degraded, "NVLinkRecoveriesRising"
	case elapsed < nvlinkRecoveryWindow:
		return // not a whole window yet, and not enough to judge early
	}
	ev.polled(gpu, r, func() string {
		return fmt.Sprintf("NVLink %d recovered %.0f times in %v (at most %.0f an hour expected)", sig.Link, rise, elapsed.Round(time.Second), p.NVLinkRecoveries.PerHour)
	})
	if elapsed >= nvlinkRecoveryWindow {
		*w = counterRate{base: sig.Value, at: ev.now, valid: true}
	}
}
