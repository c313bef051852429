package nvml_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

const eccEvents = nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccErrorStorm

// nvml.h, nvmlDeviceGetEccMode: "Only applicable to devices with ECC" (NOT_SUPPORTED otherwise);
// nvmlDeviceGetTotalEccErrors: "Requires ECC Mode to be enabled".
func TestECCMode(t *testing.T) {
	tests := []struct {
		name             string
		current, pending nvml.EnableState
		noECC            bool   // GetEccMode and the totals answer NOT_SUPPORTED
		why              string // "" when the ECC check runs
	}{
		{name: "enabled", current: nvml.FEATURE_ENABLED, pending: nvml.FEATURE_ENABLED},
		{name: "disabled", current: nvml.FEATURE_DISABLED, pending: nvml.FEATURE_DISABLED, why: "ECC is disabled"},
		{name: "disabled until the next reboot", current: nvml.FEATURE_DISABLED, pending: nvml.FEATURE_ENABLED, why: "next reboot"},
		{name: "no ECC on this part", noECC: true, why: "no ECC memory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.update(2, func(s *gpuState) {
				s.eccCurrent, s.eccPending = tc.current, tc.pending
				s.unsupported["eccMode"], s.unsupported[gpunvml.ReadingECC] = tc.noECC, tc.noECC
			})
			b := f.open()
			off := tc.why != ""
			g := b.Probe().GPUs[2]
			if why, has := g.Unmonitored[gpunvml.ReadingECC]; has != off || !strings.Contains(why, tc.why) {
				t.Errorf("probe: unmonitored %v, want ecc off because %q", g.Unmonitored, tc.why)
			}
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			f.step(b)
			d, _ := deviceStatus(m.Snapshot(), f.uuid(2))
			wantChecks := []health.Check(nil)
			if off {
				wantChecks = []health.Check{health.CheckECC}
			}
			if !slices.Equal(d.UnmonitoredChecks, wantChecks) || d.Health != health.Healthy || d.Unmonitored {
				t.Errorf("GPU 2: health %v, unmonitored checks %v, want Healthy with %v not running", d.Health, d.UnmonitoredChecks, wantChecks)
			}
			if d0, _ := deviceStatus(m.Snapshot(), f.uuid(0)); len(d0.UnmonitoredChecks) != 0 {
				t.Errorf("GPU 0 (ECC on): unmonitored checks %v", d0.UnmonitoredChecks)
			}
			if !off {
				return
			}
			if n := len(f.device(2).GetTotalEccErrorsCalls()); n != 0 {
				t.Errorf("GetTotalEccErrors called %d times with ECC off", n)
			}
			if got := kindsOf(rec.Take(), f.uuid(2)); slices.Contains(got, health.SignalECCCounters) {
				t.Errorf("ECC totals reported with ECC off: %v", got)
			}
			var registered uint64
			healthtest.Eventually(t, "GPU 2's registration", func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				registered = f.gpus[2].registered
				return registered != 0
			})
			if registered&eccEvents != 0 || registered&nvml.EventTypeXidCriticalError == 0 {
				t.Errorf("registered events %#x: want XIDs and no ECC events", registered)
			}
		})
	}
}

// callsOnAnyGPU counts the calls of one device function on every GPU.
func callsOnAnyGPU(f *fixture, calls func(*server.Device) int) int {
	n := 0
	for i := range f.srv.Devices {
		n += calls(f.device(i))
	}
	return n
}

// A function that an older libnvidia-ml lacks must never be called: go-nvml binds lazily, and
// the call would end the process with a symbol lookup error.
func TestMissingSymbols(t *testing.T) {
	clockEvents := func(d *server.Device) int { return len(d.GetCurrentClocksEventReasonsCalls()) }
	throttle := func(d *server.Device) int { return len(d.GetCurrentClocksThrottleReasonsCalls()) }
	tests := []struct {
		name    string
		missing []string
		// never lists the functions that must not be called; called those that must still be.
		never, called []func(*server.Device) int
		// notRunning are the checks every GPU reports as not running; absent lists the signal
		// kinds that must not come.
		notRunning []health.Check
		absent     []health.SignalKind
		event      uint64 // an event to send, calling for a reading
	}{
		{
			name: "clock events before driver 535: the throttle-reasons call", missing: []string{"nvmlDeviceGetCurrentClocksEventReasons"},
			never: []func(*server.Device) int{clockEvents}, called: []func(*server.Device) int{throttle},
		},
		{
			name:    "no clock-event call at all",
			missing: []string{"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
			never:   []func(*server.Device) int{clockEvents, throttle}, notRunning: []health.Check{health.CheckClockEvents},
			absent: []health.SignalKind{health.SignalClockEvents},
		},
		{
			// A driver before R450 has neither, and the event falls back to retired pages.
			name: "no row remapper", missing: []string{"nvmlDeviceGetRemappedRows", "nvmlDeviceGetArchitecture"},
			never:      []func(*server.Device) int{func(d *server.Device) int { return len(d.GetRemappedRowsCalls()) }},
			notRunning: []health.Check{health.CheckRowRemap}, absent: []health.SignalKind{health.SignalRemappedRows},
			event: nvml.EventTypeDramRetirementEvent,
		},
		{
			name: "no field values", missing: []string{"nvmlDeviceGetFieldValues"},
			never: []func(*server.Device) int{func(d *server.Device) int { return len(d.GetFieldValuesCalls()) }},
			// The NVLink recovery counts are field values too.
			notRunning: []health.Check{health.CheckNVLinkRecoveries, health.CheckRecoveryAction},
			absent:     []health.SignalKind{health.SignalRecoveryAction, health.SignalNVLinkRecoveries},
			event:      nvml.EventTypeGpuRecoveryAction,
		},
		{
			name:    "no NVLink error counters, temperature thresholds or power limit",
			missing: []string{"nvmlDeviceGetNvLinkErrorCounter", "nvmlDeviceGetTemperatureThreshold", "nvmlDeviceGetEnforcedPowerLimit"},
			never: []func(*server.Device) int{
				func(d *server.Device) int { return len(d.GetNvLinkErrorCounterCalls()) },
				func(d *server.Device) int { return len(d.GetTemperatureThresholdCalls()) },
				func(d *server.Device) int { return len(d.GetEnforcedPowerLimitCalls()) },
			},
			absent: []health.SignalKind{health.SignalNVLinkErrors},
		},
		{
			name: "no ECC mode: the totals tell", missing: []string{"nvmlDeviceGetEccMode"},
			never:  []func(*server.Device) int{func(d *server.Device) int { return len(d.GetEccModeCalls()) }},
			called: []func(*server.Device) int{func(d *server.Device) int { return len(d.GetTotalEccErrorsCalls()) }},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for _, s := range tc.missing {
				f.missing[s] = true
			}
			if f.missing["nvmlDeviceGetArchitecture"] {
				// A driver before R450 predates Ampere: its GPUs retire pages.
				for i := range f.gpus {
					f.update(i, func(s *gpuState) { s.arch = nvml.DEVICE_ARCH_VOLTA })
				}
			}
			// A reason the default policy does not act on: visible, and the GPU stays Healthy.
			f.update(0, func(s *gpuState) { s.reasons = uint64(health.ClockEventSWThermalSlowdown) })
			b := f.open()
			asked := len(f.srv.LookupSymbolCalls())
			b.Probe()
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			if tc.event != 0 {
				f.event(0, tc.event, 0)
				healthtest.Eventually(t, "the event", func() bool { return b.Stats().Events == 1 })
			}
			f.step(b)
			for i, never := range tc.never {
				if n := callsOnAnyGPU(f, never); n != 0 {
					t.Errorf("missing function %d was called %d times", i, n)
				}
			}
			for i, called := range tc.called {
				if callsOnAnyGPU(f, called) == 0 {
					t.Errorf("function %d was never called", i)
				}
			}
			got := rec.Take()
			for _, kind := range tc.absent {
				if slices.ContainsFunc(got, func(s health.Signal) bool { return s.Kind == kind }) {
					t.Errorf("%v reported without the function it needs", kind)
				}
			}
			for _, d := range m.Snapshot().Devices {
				want := tc.notRunning
				if !slices.Equal(d.UnmonitoredChecks, want) || d.Health != health.Healthy {
					t.Errorf("%s: health %v, checks not running %v, want Healthy with %v", d.Device.UUID, d.Health, d.UnmonitoredChecks, want)
				}
			}
			if !slices.Contains(tc.notRunning, health.CheckClockEvents) && !slices.ContainsFunc(got, healthtest.OfKind(health.SignalClockEvents, f.uuid(0))) {
				t.Error("clock events not reported")
			}
			if n := len(f.srv.LookupSymbolCalls()); n != asked {
				t.Errorf("LookupSymbol called %d more times after Open, want once per function at Open", n-asked)
			}
		})
	}
}

func TestMissingEventFunctions(t *testing.T) {
	f := newFixture(t)
	f.missing["nvmlEventSetCreate"] = true
	f.eventSetRet = nvml.ERROR_FUNCTION_NOT_FOUND // never asked: run does not expect a free
	b := f.open()
	if g := b.Probe().GPUs[0]; !strings.Contains(g.EventsError, "nvmlEventSetCreate") || len(g.Events) != 0 {
		t.Errorf("probe: events %v, error %q, want none and the missing function named", g.Events, g.EventsError)
	}
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	f.step(b)
	if n := len(f.srv.EventSetCreateCalls()); n != 0 {
		t.Errorf("EventSetCreate called %d times", n)
	}
	if n := callsOnAnyGPU(f, func(d *server.Device) int { return len(d.GetSupportedEventTypesCalls()) }); n != 0 {
		t.Errorf("GetSupportedEventTypes called %d times", n)
	}
	healthtest.Eventually(t, "every GPU unmonitored for events", func() bool {
		for i := range f.srv.Devices {
			if u, known := rec.Unmonitored(f.uuid(i)); !u || !known {
				return false
			}
		}
		return true
	})
	if !slices.ContainsFunc(rec.Take(), healthtest.OfKind(health.SignalSample, f.uuid(0))) {
		t.Error("sampling stopped")
	}
}
