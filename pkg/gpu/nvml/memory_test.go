package nvml_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// nvml.h, nvmlDeviceGetRemappedRows: "NVML_ERROR_NOT_SUPPORTED If MIG is enabled";
// nvmlDeviceGetMemoryErrorCounter: on MIG-enabled GPUs "Querying volatile errors using device
// handles is currently not supported". The fixture answers so for a GPU in MIG mode.
func TestMIGModeStopsMemoryChecks(t *testing.T) {
	f := newFixture(t)
	migs := f.enableMIG(2, 2)
	b := f.open()
	un := b.Probe().GPUs[2].Unmonitored
	for _, r := range []string{gpunvml.ReadingECC, gpunvml.ReadingRemappedRows} {
		if !strings.Contains(un[r], "MIG mode") {
			t.Errorf("probe: %s not running because %q, want MIG mode named", r, un[r])
		}
	}
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	f.step(b)
	// The row remapper's histogram answers NOT_SUPPORTED in MIG mode too (the fixture says so, as
	// GetRemappedRows does): found by the first round, not at Open.
	want := []health.Check{health.CheckECC, health.CheckRowRemap, health.CheckRowRemapHistogram}
	for _, uuid := range append([]string{f.uuid(2)}, migs...) {
		d, _ := deviceStatus(m.Snapshot(), uuid)
		if !slices.Equal(d.UnmonitoredChecks, want) || d.Health != health.Healthy {
			t.Errorf("%s: %v, checks not running %v, want Healthy with %v", uuid, d.Health, d.UnmonitoredChecks, want)
		}
	}
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); len(d.UnmonitoredChecks) != 0 {
		t.Errorf("GPU 0 (no MIG): checks not running %v", d.UnmonitoredChecks)
	}
	got := rec.Take()
	for _, kind := range []health.SignalKind{health.SignalECCCounters, health.SignalRemappedRows, health.SignalRetiredPages} {
		if slices.ContainsFunc(got, healthtest.OfKind(kind, f.uuid(2))) {
			t.Errorf("GPU 2 in MIG mode reported %v", kind)
		}
	}
	// A DRAM retirement event on an H100 is about the row remapper, never retired pages.
	f.event(2, nvml.EventTypeDramRetirementEvent, 0)
	got = rec.TakeUntil(t, "the event's signal", func(s health.Signal) bool {
		return s.Device == f.uuid(2) && (s.Kind == health.SignalRemappedRows || s.Kind == health.SignalRetiredPages)
	})
	if s := sigsOf(without(got, health.SignalSample), f.uuid(2)); !slices.Equal(s, []sig{{Kind: health.SignalRemappedRows, Pending: true}}) {
		t.Errorf("GPU 2 signals %+v, want a pending row remap", s)
	}
}

// Ampere and later remap rows instead of retiring pages; the fixture answers
// GetRetiredPagesPendingStatus NOT_SUPPORTED on them.
func TestRetiredPagesOnlyBeforeAmpere(t *testing.T) {
	retired := func(d *server.Device) int { return len(d.GetRetiredPagesPendingStatusCalls()) }
	tests := []struct {
		name string
		arch nvml.DeviceArchitecture
		// want is the signal a DRAM retirement event brings when the row remapper cannot tell.
		want       sig
		pageReader bool
	}{
		{"Volta retires pages", nvml.DEVICE_ARCH_VOLTA, sig{Kind: health.SignalRetiredPages, Pending: true}, true},
		{"Ampere remaps rows", nvml.DEVICE_ARCH_AMPERE, sig{Kind: health.SignalRemappedRows, Pending: true}, false},
		{"Hopper remaps rows", nvml.DEVICE_ARCH_HOPPER, sig{Kind: health.SignalRemappedRows, Pending: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			for i := range f.gpus {
				f.update(i, func(s *gpuState) {
					s.arch = tc.arch
					s.pagesPending = true
					if tc.pageReader {
						s.unsupported[gpunvml.ReadingRemappedRows] = true // no row remapper before Ampere
					} else {
						s.failing[gpunvml.ReadingRemappedRows] = true // the remapper cannot tell this time
					}
				})
			}
			b := f.open()
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			sampled := slices.ContainsFunc(rec.Take(), healthtest.OfKind(health.SignalRetiredPages, f.uuid(3)))
			if sampled != tc.pageReader || (callsOnAnyGPU(f, retired) > 0) != tc.pageReader {
				t.Errorf("retired pages sampled %v, read %d times, want read: %v", sampled, callsOnAnyGPU(f, retired), tc.pageReader)
			}
			if u := b.Probe().GPUs[3].Readings.Unsupported; slices.Contains(u, gpunvml.ReadingRetiredPages) == tc.pageReader {
				t.Errorf("probe unsupported %v, want retiredPages listed: %v", u, !tc.pageReader)
			}
			f.event(3, nvml.EventTypeDramRetirementEvent, 0)
			got := rec.TakeUntil(t, "the event's signal", func(s health.Signal) bool {
				return s.Device == f.uuid(3) && (s.Kind == health.SignalRemappedRows || s.Kind == health.SignalRetiredPages)
			})
			if s := sigsOf(without(got, health.SignalSample), f.uuid(3)); !slices.Equal(s, []sig{tc.want}) {
				t.Errorf("GPU 3 signals %+v, want %+v", s, tc.want)
			}
			if d, _ := deviceStatus(m.Snapshot(), f.uuid(3)); slices.Contains(d.UnmonitoredChecks, health.CheckRetiredPages) {
				t.Errorf("retiredPages reported as not running: it does not apply to the GPU, no data")
			}
		})
	}
}
