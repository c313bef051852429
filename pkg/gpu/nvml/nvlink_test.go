package nvml_test

import (
	"slices"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// nvml.h, nvmlDeviceGetNvLinkState: "NVML_FEATURE_ENABLED indicates that the link is active and
// NVML_FEATURE_DISABLED indicates it is inactive". A link that never was active is no fault.

// linkStates returns the NVLink states reported for a GPU, by link.
func linkStates(sigs []health.Signal, uuid string) map[uint32]bool {
	out := map[uint32]bool{}
	for _, s := range sigs {
		if s.Device == uuid && s.Kind == health.SignalNVLinkState {
			out[s.Link] = s.Down
		}
	}
	return out
}

func nvlinkDown(d health.DeviceStatus) bool {
	return slices.ContainsFunc(d.Conditions, func(c health.Condition) bool { return c.Type == health.ConditionNVLinkDown })
}

func TestNVLinksInactiveFromTheStartAreIgnored(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.links[1] = nvml.FEATURE_DISABLED })
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	f.step(b)
	if got := linkStates(rec.Take(), f.uuid(0)); len(got) != 1 || got[0] {
		t.Errorf("link states %v, want link 0 up and link 1 not reported", got)
	}
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Healthy {
		t.Fatalf("a link inactive from the start: %v %+v, want Healthy", d.Health, d.Conditions)
	}
	if l := b.Probe().GPUs[0].Readings.NVLinks; len(l) != 1 || l[0].Link != 0 {
		t.Errorf("probe NVLinks %+v, want link 0 only", l)
	}
	// A watched link that goes inactive is the fault.
	f.update(0, func(s *gpuState) { s.links[0] = nvml.FEATURE_DISABLED })
	f.step(b)
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Unhealthy || !nvlinkDown(d) {
		t.Errorf("link 0 went inactive: %v %+v, want Unhealthy with NVLinkDown", d.Health, d.Conditions)
	}
}

func TestNoNVLinkEverActive(t *testing.T) {
	// PCIe cards without bridges, passthrough VMs: every link answers SUCCESS, inactive.
	f := newFixture(t)
	for i := range f.gpus {
		f.update(i, func(s *gpuState) {
			s.links = []nvml.EnableState{nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED}
			s.unsupported["fabric"] = true
		})
	}
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	f.step(b)
	for i := range f.gpus {
		d, _ := deviceStatus(m.Snapshot(), f.uuid(i))
		if d.Health != health.Healthy {
			t.Errorf("GPU %d: %v %+v, want Healthy", i, d.Health, d.Conditions)
		}
	}
	if got := linkStates(rec.Take(), f.uuid(0)); len(got) != 0 {
		t.Errorf("link states %v, want none", got)
	}
	if r := b.Probe().GPUs[0].Readings; !slices.Contains(r.Unsupported, gpunvml.ReadingNVLink) || len(r.NVLinks) != 0 {
		t.Errorf("probe: NVLinks %+v, unsupported %v, want no link and nvlink without data", r.NVLinks, r.Unsupported)
	}
}

func TestNVLinksWaitForFabricManager(t *testing.T) {
	// An HGX H100 before Fabric Manager has registered it: no link is trained yet.
	f := newFixture(t)
	f.update(0, func(s *gpuState) {
		s.fabric = nvml.GPU_FABRIC_STATE_NOT_STARTED
		s.links = []nvml.EnableState{nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED}
	})
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	steps := []struct {
		name    string
		change  func(*gpuState)
		states  map[uint32]bool // link -> down
		pending bool
		health  health.Severity
	}{
		{"not started", func(*gpuState) {}, map[uint32]bool{}, true, health.Healthy},
		{"in progress, a link trained", func(s *gpuState) {
			s.fabric, s.links[0] = nvml.GPU_FABRIC_STATE_IN_PROGRESS, nvml.FEATURE_ENABLED
		}, map[uint32]bool{}, true, health.Healthy},
		{"completed: the active links join", func(s *gpuState) {
			s.fabric, s.links[1] = nvml.GPU_FABRIC_STATE_COMPLETED, nvml.FEATURE_ENABLED
		}, map[uint32]bool{0: false, 1: false}, false, health.Healthy},
		{"a joined link goes inactive", func(s *gpuState) { s.links[1] = nvml.FEATURE_DISABLED },
			map[uint32]bool{0: false, 1: true}, false, health.Unhealthy},
	}
	for _, st := range steps {
		f.update(0, st.change)
		rec.Take()
		f.step(b)
		if got := linkStates(rec.Take(), f.uuid(0)); !mapsEqual(got, st.states) {
			t.Errorf("%s: link states %v, want %v", st.name, got, st.states)
		}
		if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != st.health {
			t.Errorf("%s: %v %+v, want %v", st.name, d.Health, d.Conditions, st.health)
		}
		if p := b.Probe().GPUs[0].Readings.NVLinkFabricPending; p != st.pending {
			t.Errorf("%s: probe nvlinkFabricPending %v, want %v", st.name, p, st.pending)
		}
	}
}

func TestNVLinksComingUpWithoutFabricStateWaitForARestart(t *testing.T) {
	// An HGX A100 has no GPU fabric state: a link trained after the first scan is not watched.
	f := newFixture(t)
	f.update(0, func(s *gpuState) {
		s.unsupported["fabric"] = true
		s.links = []nvml.EnableState{nvml.FEATURE_DISABLED, nvml.FEATURE_DISABLED}
	})
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	for _, state := range []nvml.EnableState{nvml.FEATURE_ENABLED, nvml.FEATURE_DISABLED} {
		f.update(0, func(s *gpuState) { s.links[0] = state })
		f.step(b)
		if got := linkStates(rec.Take(), f.uuid(0)); len(got) != 0 {
			t.Errorf("link 0 %v: link states %v, want none", state, got)
		}
		if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Healthy {
			t.Errorf("link 0 %v: %v %+v, want Healthy", state, d.Health, d.Conditions)
		}
	}
}

func mapsEqual(a, b map[uint32]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// nvml.h, nvmlNvLinkErrorCounter_t: NVML_NVLINK_ERROR_DL_ECC_DATA = 4, "Data link receive data
// ECC error counter", where Hopper counts receive errors.
func TestNVLinkECCDataErrorsCount(t *testing.T) {
	tests := []struct {
		name  string
		setup func(*gpuState)
		want  int64
	}{
		{"Hopper: ECC data errors join the sum", func(s *gpuState) { s.linkECC[0] = 7 }, 12},
		{"NOT_SUPPORTED: no data", func(s *gpuState) { s.linkECC[0], s.unsupported["nvlinkECC"] = 7, true }, 5},
		{"a driver before the counter: INVALID_ARGUMENT is no data", func(s *gpuState) {
			s.linkECC[0], s.rets["nvlinkECC"] = 7, nvml.ERROR_INVALID_ARGUMENT
		}, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.update(0, func(s *gpuState) { s.linkErrors[0] = 5 })
			f.update(0, tc.setup)
			b := f.open()
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			var got []int64
			for _, s := range rec.Take() {
				if s.Device == f.uuid(0) && s.Kind == health.SignalNVLinkErrors && s.Link == 0 {
					got = append(got, s.Value)
				}
			}
			if !slices.Equal(got, []int64{tc.want}) {
				t.Errorf("link 0 errors %v, want [%d]", got, tc.want)
			}
			if n := b.Stats().SampleErrors; n != 0 {
				t.Errorf("Stats.SampleErrors = %d, want 0: no data is no error", n)
			}
			if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Healthy {
				t.Errorf("%v %+v, want Healthy", d.Health, d.Conditions)
			}
		})
	}
}
