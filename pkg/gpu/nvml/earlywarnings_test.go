package nvml_test

import (
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The fabric state, the row remapper histogram, the SRAM ECC status, the PCIe link and the
// NVLink recovery counts, as nvml.h documents them, each with its NOT_SUPPORTED, missing-function
// and garbage answers.

// earlyRun is one backend run on the fixture: a monitor under the default policy and a recorder.
type earlyRun struct {
	f   *fixture
	b   *gpunvml.Backend
	m   *health.Monitor
	rec *healthtest.Recorder
}

// runEarly opens and runs the fixture's backend; the first round has run when it returns.
func runEarly(t *testing.T, f *fixture, opts ...gpunvml.Option) *earlyRun {
	t.Helper()
	b := f.open(opts...)
	r := &earlyRun{f: f, b: b, m: newMonitor(t, b), rec: &healthtest.Recorder{}}
	f.run(b, teeSink{r.rec, r.m})
	return r
}

// signals returns, and forgets, GPU i's signals of kind.
func (r *earlyRun) signals(i int, kind health.SignalKind) []health.Signal {
	var out []health.Signal
	for _, s := range r.rec.Take() {
		if s.Device == r.f.uuid(i) && s.Kind == kind {
			out = append(out, s)
		}
	}
	return out
}

// status returns GPU i's status.
func (r *earlyRun) status(i int) health.DeviceStatus {
	d, _ := deviceStatus(r.m.Snapshot(), r.f.uuid(i))
	return d
}

// reasons returns the reasons of GPU i's conditions.
func (r *earlyRun) reasons(i int) []string {
	var out []string
	for _, c := range r.status(i).Conditions {
		out = append(out, c.Reason)
	}
	return out
}

// checkOff reports whether check does not run on GPU i.
func (r *earlyRun) checkOff(i int, check health.Check) bool {
	return slices.Contains(r.status(i).UnmonitoredChecks, check)
}

// Bits of nvml.h's fabric health mask: each field's TRUE (1) at its shift.
const (
	maskDegradedBW     = nvml.GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE << nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
	maskRouteRecovery  = nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_TRUE << nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY
	maskRouteUnhealthy = nvml.GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE << nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY
	maskAccessTimeout  = nvml.GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_TRUE << nvml.GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY
	// FALSE (2) in every field: a healthy fabric of a driver that reports them all.
	maskAllFalse = 2 | 2<<2 | 2<<4 | 2<<6
)

func TestFabric(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*gpuState)
		missing []string
		// versionV is the newest nvmlGpuFabricInfo version the driver takes (0: the versioned
		// call is missing, or the handle cannot be asked: the plain call answers).
		versionV int
		want     *health.FabricReading // nil: no SignalFabric
		off      bool                  // the fabric check does not run
		reasons  []string
	}{
		{name: "plain call: registered", want: &health.FabricReading{State: health.FabricCompleted}},
		{
			name: "plain call: completed with an error", setup: func(s *gpuState) { s.fabricStatus = uint32(nvml.ERROR_UNKNOWN) },
			want: &health.FabricReading{State: health.FabricCompleted, Status: uint32(nvml.ERROR_UNKNOWN)}, reasons: []string{"FabricRegistrationFailed"},
		},
		{
			name: "v3: every health field false", versionV: 3, setup: func(s *gpuState) { s.fabricMask = maskAllFalse },
			want: &health.FabricReading{State: health.FabricCompleted},
		},
		{
			name: "v3: bandwidth degraded, route recovery", versionV: 3, setup: func(s *gpuState) { s.fabricMask = maskAllFalse&^(3|3<<2) | maskDegradedBW | maskRouteRecovery },
			want:    &health.FabricReading{State: health.FabricCompleted, DegradedBandwidth: true, RouteRecovery: true},
			reasons: []string{"FabricBandwidthDegraded"},
		},
		{
			name: "a driver that takes v2 only: the mask still read", versionV: 2, setup: func(s *gpuState) { s.fabricMask = maskRouteUnhealthy | maskAccessTimeout },
			want:    &health.FabricReading{State: health.FabricCompleted, RouteUnhealthy: true, AccessTimeoutRecovery: true},
			reasons: []string{"FabricRouteUnhealthy"},
		},
		{name: "outside an NVLink fabric: NOT_SUPPORTED", setup: func(s *gpuState) { s.unsupported["fabric"] = true }, off: true},
		{name: "state NOT_SUPPORTED", setup: func(s *gpuState) { s.fabric = nvml.GPU_FABRIC_STATE_NOT_SUPPORTED }, off: true},
		{name: "a state NVML does not define: not believed", setup: func(s *gpuState) { s.fabric = 9 }, off: true},
		{name: "a driver without either call (470)", missing: []string{"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"}, off: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for _, s := range tc.missing {
				f.missing[s] = true
			}
			if tc.setup != nil {
				f.update(0, tc.setup)
			}
			var opts []gpunvml.Option
			if tc.versionV > 0 {
				opts = append(opts, f.fabricInfoV(tc.versionV))
			}
			r := runEarly(t, f, opts...)
			r.f.step(r.b)
			got := r.signals(0, health.SignalFabric)
			switch {
			case tc.want == nil && len(got) != 0:
				t.Errorf("fabric signals %+v, want none", got)
			case tc.want != nil && (len(got) != 2 || got[1].Fabric != *tc.want):
				t.Errorf("fabric signals %+v, want two rounds of %+v", got, *tc.want)
			}
			if off := r.checkOff(0, health.CheckFabric); off != tc.off {
				t.Errorf("fabric check not running: %v, want %v", off, tc.off)
			}
			if got := r.reasons(0); !slices.Equal(got, tc.reasons) {
				t.Errorf("conditions %v, want %v", got, tc.reasons)
			}
			if slices.Contains(tc.missing, "nvmlDeviceGetGpuFabricInfo") {
				if n := callsOnAnyGPU(f, func(d *server.Device) int { return len(d.GetGpuFabricInfoCalls()) }); n != 0 {
					t.Errorf("the missing GetGpuFabricInfo was called %d times", n)
				}
			}
			if p := r.b.Probe().GPUs[0].Readings.Fabric; (p != nil) != (tc.want != nil) || (p != nil && (p.HealthMask != nil) != (tc.versionV > 0)) {
				t.Errorf("probe fabric %+v", p)
			}
		})
	}
}

// The NVLinks' wait for Fabric Manager reuses the round's fabric reading: one fabric call per
// GPU per round, with the versioned call as with the plain one.
func TestFabricReadOncePerRound(t *testing.T) {
	for _, versioned := range []bool{false, true} {
		f := newFixture(t)
		f.update(0, func(s *gpuState) { s.fabric = nvml.GPU_FABRIC_STATE_IN_PROGRESS })
		var vCalls atomic.Int64
		opts := []gpunvml.Option{}
		if versioned {
			opts = append(opts, gpunvml.WithFabricInfoV(func(h nvml.Device, version int) (nvml.GpuFabricInfo_v3, nvml.Return) {
				if h == f.srv.Devices[0] {
					vCalls.Add(1)
				}
				return nvml.GpuFabricInfo_v3{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}, nvml.SUCCESS
			}))
		}
		r := runEarly(t, f, opts...)
		for range 3 {
			r.f.step(r.b)
		}
		rounds := int(r.b.Stats().Rounds)
		calls := len(f.device(0).GetGpuFabricInfoCalls())
		if versioned {
			calls = int(vCalls.Load())
		}
		if calls != rounds {
			t.Errorf("versioned %v: %d fabric calls in %d rounds, want one a round", versioned, calls, rounds)
		}
		if !r.b.Probe().GPUs[0].Readings.NVLinkFabricPending {
			t.Errorf("versioned %v: NVLinks not waiting for Fabric Manager", versioned)
		}
	}
}

func TestRowRemapHistogram(t *testing.T) {
	f := newFixture(t)
	f.update(1, func(s *gpuState) { s.histogram = nvml.RowRemapperHistogramValues{Max: 630, Low: 8, None: 2} })
	f.update(2, func(s *gpuState) { s.unsupported[gpunvml.ReadingRowRemapHistogram] = true })
	f.update(3, func(s *gpuState) { s.histogram.None = 0xFFFFFFFF })
	r := runEarly(t, f)
	got := map[int][]health.Signal{}
	sigs := r.rec.Take()
	for i := range 4 {
		for _, s := range sigs {
			if s.Device == f.uuid(i) && s.Kind == health.SignalRowRemapHistogram {
				got[i] = append(got[i], s)
			}
		}
	}
	if s := got[1]; len(s) != 1 || s[0].BanksLow != 8 || s[0].BanksNone != 2 {
		t.Errorf("GPU 1 histogram %+v, want 8 low and 2 none", s)
	}
	if reasons := r.reasons(1); !slices.Equal(reasons, []string{"RowRemapAvailabilityNone"}) {
		t.Errorf("GPU 1 conditions %v", reasons)
	}
	for _, i := range []int{2, 3} {
		if len(got[i]) != 0 || !r.checkOff(i, health.CheckRowRemapHistogram) {
			t.Errorf("GPU %d: signals %+v, check off %v; want none, and the check not running", i, got[i], r.checkOff(i, health.CheckRowRemapHistogram))
		}
	}
	if r.checkOff(0, health.CheckRowRemapHistogram) || r.b.Stats().Glitches != 1 {
		t.Errorf("GPU 0 check off %v, glitches %d; want running and the one glitch of GPU 3", r.checkOff(0, health.CheckRowRemapHistogram), r.b.Stats().Glitches)
	}
	// A believable reading again: the check runs again.
	f.update(3, func(s *gpuState) { s.histogram.None = 0 })
	r.f.step(r.b)
	if r.checkOff(3, health.CheckRowRemapHistogram) || len(r.signals(3, health.SignalRowRemapHistogram)) != 1 {
		t.Error("GPU 3's histogram check does not run again after a believable reading")
	}
}

func TestRowRemapHistogramMissing(t *testing.T) {
	f := newFixture(t)
	f.missing["nvmlDeviceGetRowRemapperHistogram"] = true
	r := runEarly(t, f)
	r.f.step(r.b)
	if n := callsOnAnyGPU(f, func(d *server.Device) int { return len(d.GetRowRemapperHistogramCalls()) }); n != 0 {
		t.Errorf("the missing function was called %d times", n)
	}
	if len(r.signals(0, health.SignalRowRemapHistogram)) != 0 || !r.checkOff(0, health.CheckRowRemapHistogram) {
		t.Error("want no histogram and the check not running")
	}
}

func TestSRAMThreshold(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*gpuState)
		missing bool
		want    *bool // the signal's Failure; nil: no signal
		off     bool
		glitch  bool // a reading not believed: an error and a glitch, counted
	}{
		{name: "under the threshold", want: new(false)},
		{name: "past the threshold", setup: func(s *gpuState) { s.sram.BThresholdExceeded, s.sram.AggregateUncParity = 1, 3 }, want: new(true)},
		{name: "NOT_SUPPORTED (before Ampere)", setup: func(s *gpuState) { s.unsupported[gpunvml.ReadingSRAM] = true }, off: true},
		{name: "NO_PERMISSION (not root)", setup: func(s *gpuState) { s.rets[gpunvml.ReadingSRAM] = nvml.ERROR_NO_PERMISSION }, off: true},
		{name: "a flag that is neither 0 nor 1", setup: func(s *gpuState) { s.sram.BThresholdExceeded = 0xdeadbeef }, off: true, glitch: true},
		{name: "a driver before 535", missing: true, off: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.missing {
				f.missing["nvmlDeviceGetSramEccErrorStatus"] = true
			}
			if tc.setup != nil {
				f.update(0, tc.setup)
			}
			r := runEarly(t, f)
			got := r.signals(0, health.SignalSRAMThreshold)
			switch {
			case tc.want == nil && len(got) != 0, tc.want != nil && (len(got) != 1 || got[0].Failure != *tc.want):
				t.Errorf("SRAM signals %+v, want failure %v", got, tc.want)
			}
			if off := r.checkOff(0, health.CheckSRAM); off != tc.off {
				t.Errorf("SRAM check not running: %v, want %v", off, tc.off)
			}
			wantReasons := []string(nil)
			if tc.want != nil && *tc.want {
				wantReasons = []string{"SRAMECCThresholdExceeded"}
			}
			if reasons := r.reasons(0); !slices.Equal(reasons, wantReasons) {
				t.Errorf("conditions %v, want %v", reasons, wantReasons)
			}
			if tc.missing && len(f.device(0).GetSramEccErrorStatusCalls()) != 0 {
				t.Error("the missing function was called")
			}
			if st := r.b.Stats(); st.SampleErrors != b2u(tc.glitch) || st.Glitches != b2u(tc.glitch) {
				t.Errorf("Stats: %d sample errors, %d glitches; want %d of each (no data is no error)", st.SampleErrors, st.Glitches, b2u(tc.glitch))
			}
		})
	}
}

func TestPCIeLink(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(*gpuState)
		missing []string
		want    *health.PCIeLinkReading
		off     bool
		reasons []string
	}{
		{name: "gen 5 x16 of gen 5 x16", want: &health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 16, MaxWidth: 16}},
		{
			name: "trained x8", setup: func(s *gpuState) { s.pcieWidth = 8 },
			want: &health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 8, MaxWidth: 16}, reasons: []string{"PCIeLinkDegraded"},
		},
		{
			// The default policy compares widths only: a link that slows down at idle is no fault.
			name: "gen 1 at idle", setup: func(s *gpuState) { s.pcieGen = 1 },
			want: &health.PCIeLinkReading{Gen: 1, MaxGen: 5, Width: 16, MaxWidth: 16},
		},
		{
			name: "maximum width NOT_SUPPORTED: unknown", setup: func(s *gpuState) { s.unsupported["pcieMaxWidth"], s.pcieWidth = true, 8 },
			want: &health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 8},
		},
		{
			name: "a driver without the system's maximum generation: the GPU's", missing: []string{"nvmlDeviceGetMaxPcieLinkGeneration"},
			setup: func(s *gpuState) { s.pcieMaxGen = 4 }, want: &health.PCIeLinkReading{Gen: 5, MaxGen: 4, Width: 16, MaxWidth: 16},
		},
		{name: "NOT_SUPPORTED", setup: func(s *gpuState) { s.unsupported[gpunvml.ReadingPCIeLink] = true }, off: true},
		{name: "a width above x32", setup: func(s *gpuState) { s.pcieWidth = 255 }, off: true},
		{name: "a maximum generation above 32", setup: func(s *gpuState) { s.pcieMaxGen = 0x7fffffff }, off: true},
		{name: "no width call", missing: []string{"nvmlDeviceGetCurrPcieLinkWidth"}, off: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for _, s := range tc.missing {
				f.missing[s] = true
			}
			if tc.setup != nil {
				f.update(0, tc.setup)
			}
			r := runEarly(t, f)
			got := r.signals(0, health.SignalPCIeLink)
			switch {
			case tc.want == nil && len(got) != 0, tc.want != nil && (len(got) != 1 || got[0].PCIe != *tc.want):
				t.Errorf("PCIe link signals %+v, want %+v", got, tc.want)
			}
			if off := r.checkOff(0, health.CheckPCIeLink); off != tc.off {
				t.Errorf("PCIe link check not running: %v, want %v", off, tc.off)
			}
			// PCIeLinkDegraded needs its samples: a few more rounds.
			for range 3 {
				r.f.step(r.b)
			}
			if reasons := r.reasons(0); !slices.Equal(reasons, tc.reasons) {
				t.Errorf("conditions %v, want %v", reasons, tc.reasons)
			}
			for _, s := range tc.missing {
				if s == "nvmlDeviceGetMaxPcieLinkGeneration" && len(f.device(0).GetMaxPcieLinkGenerationCalls()) != 0 {
					t.Error("the missing function was called")
				}
			}
		})
	}
}

func TestNVLinkRecoveries(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*gpuState)
		want  []int64 // per link, the last signal's value; nil: no signal
		off   bool
	}{
		{name: "successful and failed recoveries add up", setup: func(s *gpuState) {
			s.recoveriesOK[0], s.recoveriesFailed[0], s.recoveriesOK[1] = 5, 2, 1
		}, want: []int64{7, 1}},
		{name: "a driver before the fields: NOT_SUPPORTED in each field", setup: func(s *gpuState) {
			s.unsupported[gpunvml.ReadingNVLinkRecoveries] = true
		}, off: true},
		{name: "a driver that does not know the fields: INVALID_ARGUMENT", setup: func(s *gpuState) {
			s.rets[gpunvml.ReadingNVLinkRecoveries] = nvml.ERROR_INVALID_ARGUMENT
		}, off: true},
		{name: "a count past any plausible one", setup: func(s *gpuState) { s.recoveriesOK[1] = 1 << 40 }, off: true},
		{name: "a value type that is no count", setup: func(s *gpuState) { s.recoveryValueType = nvml.VALUE_TYPE_DOUBLE }, off: true},
		{name: "no NVLink: nothing to count, and no check off", setup: func(s *gpuState) { s.unsupported[gpunvml.ReadingNVLink] = true }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.update(0, tc.setup)
			r := runEarly(t, f)
			got := map[uint32]int64{}
			for _, s := range r.signals(0, health.SignalNVLinkRecoveries) {
				got[s.Link] = s.Value
			}
			if len(got) != len(tc.want) {
				t.Errorf("recoveries %v, want %v", got, tc.want)
			}
			for link, v := range tc.want {
				if got[uint32(link)] != v {
					t.Errorf("link %d recoveries %d, want %d", link, got[uint32(link)], v)
				}
			}
			if off := r.checkOff(0, health.CheckNVLinkRecoveries); off != tc.off {
				t.Errorf("NVLink recoveries check not running: %v, want %v", off, tc.off)
			}
		})
	}
}

// Recoveries rising within the hour make the link Degraded (the library's rule, from the
// backend's counts).
func TestNVLinkRecoveriesRising(t *testing.T) {
	f := newFixture(t)
	r := runEarly(t, f)
	f.update(0, func(s *gpuState) { s.recoveriesOK[1] = 4 })
	r.f.step(r.b)
	if got := r.reasons(0); !slices.Equal(got, []string{"NVLinkRecoveriesRising"}) {
		t.Errorf("conditions %v, want NVLinkRecoveriesRising", got)
	}
}

// With an expected link count, a link NVML has but that was never active is reported down;
// without one (TestNVLinksInactiveFromTheStartAreIgnored) it is not watched.
func TestExpectedNVLinks(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.links[1] = nvml.FEATURE_DISABLED })
	f.update(1, func(s *gpuState) {
		s.fabric = nvml.GPU_FABRIC_STATE_IN_PROGRESS
		s.links = []nvml.EnableState{nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED}
	})
	// Four expected, two present: only the two NVML has can be watched.
	r := runEarly(t, f, gpunvml.WithExpectedNVLinks(4))
	sigs := r.rec.Take()
	if got := linkStates(sigs, f.uuid(0)); !mapsEqual(got, map[uint32]bool{0: false, 1: true}) {
		t.Errorf("GPU 0 link states %v, want link 1 down from boot", got)
	}
	if d := r.status(0); d.Health != health.Unhealthy || !nvlinkDown(d) {
		t.Errorf("GPU 0: %v %+v, want Unhealthy with NVLinkDown", d.Health, d.Conditions)
	}
	if got := linkStates(sigs, f.uuid(2)); !mapsEqual(got, map[uint32]bool{0: false, 1: false}) {
		t.Errorf("GPU 2 link states %v, want both up", got)
	}
	// While Fabric Manager registers GPU 1 no link is trained: none is down yet. Once it has,
	// the link that did not come up is.
	if got := linkStates(sigs, f.uuid(1)); len(got) != 0 {
		t.Errorf("GPU 1 while registering: link states %v, want none", got)
	}
	f.update(1, func(s *gpuState) { s.fabric, s.links[0] = nvml.GPU_FABRIC_STATE_COMPLETED, nvml.FEATURE_ENABLED })
	r.f.step(r.b)
	if got := linkStates(r.rec.Take(), f.uuid(1)); !mapsEqual(got, map[uint32]bool{0: false, 1: true}) {
		t.Errorf("GPU 1 once registered: link states %v, want link 1 down", got)
	}
	// The dead link comes up: the GPU recovers (after the NVLink check's samples).
	f.update(0, func(s *gpuState) { s.links[1] = nvml.FEATURE_ENABLED })
	r.f.stepUntil("GPU 0 healthy", samplePeriod, func() bool { return r.status(0).Health == health.Healthy })
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
