package health_test

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func withFabric(f health.FabricReading) func(*health.Signal) {
	return func(s *health.Signal) { s.Fabric = f }
}

func TestFabricRegistration(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	// Completed with a failed status (Azure/azhpc-images#506): Unhealthy.
	out := h.signal(health.SignalFabric, g0.UUID, 0, withFabric(health.FabricReading{State: health.FabricCompleted, Status: 3}))
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Unhealthy, "FabricRegistrationFailed"))
	out = h.signal(health.SignalFabric, g0.UUID, time.Minute, withFabric(health.FabricReading{State: health.FabricCompleted}))
	wantTransitions(t, out, tr(g0.UUID, health.Unhealthy, health.Healthy, health.ReasonRecovered))

	// Still registering: nothing until the timeout, then Degraded until it completes.
	g1 := gpuDevice(1)
	h = newHarness(t, health.DefaultPolicy(), g1)
	pending := withFabric(health.FabricReading{State: health.FabricInProgress})
	if out := h.signal(health.SignalFabric, g1.UUID, 0, pending); len(out) != 0 {
		t.Fatalf("a fresh registration changed health: %v", out)
	}
	if out := h.signal(health.SignalFabric, g1.UUID, health.DefaultFabricTimeout-time.Second, pending); len(out) != 0 {
		t.Fatalf("a registration within its timeout changed health: %v", out)
	}
	out = h.signal(health.SignalFabric, g1.UUID, health.DefaultFabricTimeout, pending)
	wantTransitions(t, out, tr(g1.UUID, health.Healthy, health.Degraded, "FabricRegistrationPending"))
	out = h.signal(health.SignalFabric, g1.UUID, health.DefaultFabricTimeout+time.Second, withFabric(health.FabricReading{State: health.FabricCompleted}))
	wantTransitions(t, out, tr(g1.UUID, health.Degraded, health.Healthy, health.ReasonRecovered))

	// A degraded fabric; a GPU without a fabric says nothing.
	out = h.signal(health.SignalFabric, g1.UUID, time.Hour, withFabric(health.FabricReading{State: health.FabricCompleted, DegradedBandwidth: true}))
	wantTransitions(t, out, tr(g1.UUID, health.Healthy, health.Degraded, "FabricBandwidthDegraded"))
	h2 := newHarness(t, health.DefaultPolicy(), g0)
	for i := range 100 {
		if out := h2.signal(health.SignalFabric, g0.UUID, time.Duration(i)*time.Hour, withFabric(health.FabricReading{State: health.FabricNotSupported})); len(out) != 0 {
			t.Fatalf("no fabric changed health: %v", out)
		}
	}
}

func TestEarlyWarningsAreDegradedAndClearWhenTheReadingIsBack(t *testing.T) {
	g0 := gpuDevice(0)
	for _, tc := range []struct {
		name       string
		kind       health.SignalKind
		bad, good  func(*health.Signal)
		wantReason string
		wantAction health.Action
		samples    int
	}{
		{"row remapper banks with no spare rows", health.SignalRowRemapHistogram,
			func(s *health.Signal) { s.BanksNone, s.BanksLow = 1, 2 }, func(s *health.Signal) {}, "RowRemapAvailabilityNone", health.ActionReplaceSoon, 1},
		{"row remapper banks with few spare rows", health.SignalRowRemapHistogram,
			func(s *health.Signal) { s.BanksLow = 1 }, func(s *health.Signal) {}, "RowRemapAvailabilityLow", health.ActionReplaceSoon, 1},
		{"SRAM threshold", health.SignalSRAMThreshold, withFailure(true), withFailure(false), "SRAMECCThresholdExceeded", health.ActionReplaceSoon, 1},
		{"PCIe link narrower than it can", health.SignalPCIeLink,
			func(s *health.Signal) { s.PCIe = health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 8, MaxWidth: 16} },
			func(s *health.Signal) { s.PCIe = health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 16, MaxWidth: 16} },
			"PCIeLinkDegraded", health.ActionInspect, health.DefaultRecoverySamples},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy(), g0)
			out := h.signal(tc.kind, g0.UUID, 0, tc.bad)
			wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, tc.wantReason))
			for _, c := range h.status(g0.UUID).Conditions {
				if c.RecommendedAction != tc.wantAction || c.ClearsOn != health.ClearsOnRecovered {
					t.Errorf("condition %+v, want %s, clears on recovered", c, tc.wantAction)
				}
			}
			for i := 1; i <= tc.samples; i++ {
				out = h.signal(tc.kind, g0.UUID, time.Duration(i)*time.Minute, tc.good)
			}
			wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Healthy, health.ReasonRecovered))
		})
	}
}

func TestPCIeGenerationIsJudgedOnlyWhenAskedFor(t *testing.T) {
	g0 := gpuDevice(0)
	slow := func(s *health.Signal) { s.PCIe = health.PCIeLinkReading{Gen: 1, MaxGen: 5, Width: 16, MaxWidth: 16} }
	h := newHarness(t, health.DefaultPolicy(), g0)
	if out := h.signal(health.SignalPCIeLink, g0.UUID, 0, slow); len(out) != 0 {
		t.Errorf("an idle GPU's gen 1 link changed health by default: %v", out)
	}
	p := health.DefaultPolicy()
	p.PCIeLink.Generation = true
	h = newHarness(t, p, g0)
	wantTransitions(t, h.signal(health.SignalPCIeLink, g0.UUID, 0, slow), tr(g0.UUID, health.Healthy, health.Degraded, "PCIeLinkDegraded"))
}

func TestNVLinkRecoveriesRisingWithinAnHour(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	rec := func(link uint32, n int64) func(*health.Signal) {
		return func(s *health.Signal) { s.Link, s.Value = link, n }
	}
	h.signal(health.SignalNVLinkRecoveries, g0.UUID, 0, rec(3, 100)) // a lifetime count: a baseline
	if out := h.signal(health.SignalNVLinkRecoveries, g0.UUID, 10*time.Minute, rec(3, 101)); len(out) != 0 {
		t.Fatalf("one recovery changed health: %v", out)
	}
	out := h.signal(health.SignalNVLinkRecoveries, g0.UUID, 20*time.Minute, rec(3, 103))
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, "NVLinkRecoveriesRising"))
	if c := h.mustCondition(g0.UUID, health.ConditionNVLinkRecoveries, 3); c.RecommendedAction != health.ActionInspect {
		t.Errorf("condition %+v", c)
	}
	// The next hour is quiet: it clears.
	h.signal(health.SignalNVLinkRecoveries, g0.UUID, 70*time.Minute, rec(3, 103))
	out = h.signal(health.SignalNVLinkRecoveries, g0.UUID, 131*time.Minute, rec(3, 103))
	wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Healthy, health.ReasonRecovered))
	// A counter that goes back (a driver reload) is a new baseline, not a fall.
	if out := h.signal(health.SignalNVLinkRecoveries, g0.UUID, 140*time.Minute, rec(3, 0)); len(out) != 0 {
		t.Errorf("a counter reset changed health: %v", out)
	}
}

func TestEarlyWarningChecksCanBeTurnedOff(t *testing.T) {
	g0 := gpuDevice(0)
	p := health.DefaultPolicy()
	p.Fabric.Enabled, p.RowRemapHistogram.Enabled, p.SRAM.Enabled, p.PCIeLink.Enabled, p.NVLinkRecoveries.Enabled = false, false, false, false, false
	h := newHarness(t, p, g0)
	h.signal(health.SignalFabric, g0.UUID, 0, withFabric(health.FabricReading{State: health.FabricCompleted, Status: 3}))
	h.signal(health.SignalRowRemapHistogram, g0.UUID, 0, func(s *health.Signal) { s.BanksNone = 5 })
	h.signal(health.SignalSRAMThreshold, g0.UUID, 0, withFailure(true))
	h.signal(health.SignalPCIeLink, g0.UUID, 0, func(s *health.Signal) { s.PCIe = health.PCIeLinkReading{Width: 1, MaxWidth: 16} })
	h.signal(health.SignalNVLinkRecoveries, g0.UUID, 0, func(s *health.Signal) { s.Value = 1 })
	h.signal(health.SignalNVLinkRecoveries, g0.UUID, time.Minute, func(s *health.Signal) { s.Value = 100 })
	h.wantHealth(g0.UUID, health.Healthy, false)
	// The device plugin's profile runs none of them.
	h = newHarness(t, health.DevicePluginPolicy(), g0)
	h.signal(health.SignalSRAMThreshold, g0.UUID, 0, withFailure(true))
	h.wantHealth(g0.UUID, health.Healthy, false)
}
