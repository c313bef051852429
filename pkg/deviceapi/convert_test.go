package deviceapi_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/deviceapitest"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi/v1alpha1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// gpus returns n GPUs as NVML names them; mig adds one MIG instance (GPU instance 1, compute
// instance 0) to GPU 0.
func gpus(n int, mig bool) []health.Device {
	out := make([]health.Device, n)
	for i := range out {
		out[i] = health.Device{UUID: fmt.Sprintf("GPU-%08X-0000-0000-0000-00000000000%d", 0xABCDEF00+i, i), Index: i, PCIBusID: fmt.Sprintf("00000000:%X:00.0", 0x10+i)}
	}
	if mig {
		out = append(out, health.Device{UUID: "MIG-0B1C2D3E-0000-0000-0000-000000000001", Index: 0,
			MIG: &health.MIGPlacement{ParentUUID: out[0].UUID, GPUInstance: 1, ComputeInstance: 0}})
	}
	return out
}

// newMonitor returns a real Monitor of devs under the default policy.
func newMonitor(t testing.TB, devs []health.Device) *health.Monitor {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	return health.NewMonitor(tr)
}

// summary is deviceapitest.Describe.
var summary = deviceapitest.Describe

func condition(g *v1alpha1.Gpu, typ string) *v1alpha1.Condition {
	for _, c := range g.GetStatus().GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	return nil
}

func TestConvertMapsEveryVerdict(t *testing.T) {
	devs := gpus(2, true)
	g0, g1, mig := devs[0].UUID, devs[1].UUID, devs[2].UUID
	n0, n1 := strings.ToLower(g0), strings.ToLower(g1)
	for _, tc := range []struct {
		name string
		feed func(m *health.Monitor)
		// want is each Gpu's summary, in order.
		want []string
		// message, when set, is a part GPU 0's Ready message must hold.
		message string
	}{
		{
			name: "healthy GPUs are Ready with every family True; the MIG instance is no Gpu of its own",
			feed: func(*health.Monitor) {},
			want: []string{n0 + " Ready=True/Healthy", n1 + " Ready=True/Healthy"},
		},
		{
			name: "an Unhealthy XID makes Ready and XIDHealthy False with its reason and asks for a reset",
			feed: func(m *health.Monitor) { m.Signal(health.XIDSignal(g1, 48, t0)) },
			want: []string{n0 + " Ready=True/Healthy", n1 + " Ready=False/XID48 XIDHealthy=False/XID48 action=ResetGPU"},
		},
		{
			name: "a Degraded GPU stays Ready with the worst reason; its family is False",
			feed: func(m *health.Monitor) {
				m.Signal(health.Signal{Kind: health.SignalTemperature, Device: g0, Time: t0, Value: 92, SlowdownC: 90, ShutdownC: 95})
			},
			want:    []string{n0 + " Ready=True/TemperatureAtSlowdown ThermalHealthy=False/TemperatureAtSlowdown action=CheckCooling", n1 + " Ready=True/Healthy"},
			message: "Degraded: temperature 92°C",
		},
		{
			name: "the worst fault sets Ready and the action; every family with a fault is False",
			feed: func(m *health.Monitor) {
				m.Signal(health.Signal{Kind: health.SignalTemperature, Device: g0, Time: t0, Value: 92, SlowdownC: 90, ShutdownC: 95})
				m.Signal(health.Signal{Kind: health.SignalRemappedRows, Device: g0, Time: t0, Failure: true})
			},
			want:    []string{n0 + " Ready=False/RowRemapFailure MemoryHealthy=False/RowRemapFailure ThermalHealthy=False/TemperatureAtSlowdown action=CheckHardware", n1 + " Ready=True/Healthy"},
			message: "; also TemperatureAtSlowdown",
		},
		{
			name: "a MIG instance's own fault counts for its GPU, and says which instance",
			feed: func(m *health.Monitor) {
				m.Signal(health.Signal{Kind: health.SignalXID, Device: g0, Time: t0, XID: 95, MIGScoped: true, GPUInstance: 1, ComputeInstance: health.NoInstance})
			},
			want:    []string{n0 + " Ready=False/XID95 XIDHealthy=False/XID95 action=ResetGPU", n1 + " Ready=True/Healthy"},
			message: "MIG instance " + mig + " (GPU instance 1, compute instance 0): XID 95",
		},
		{
			name: "a lost GPU is a presence fault",
			feed: func(m *health.Monitor) { m.Signal(health.Signal{Kind: health.SignalLost, Device: g1, Time: t0}) },
			want: []string{n0 + " Ready=True/Healthy", n1 + " Ready=False/GPULost PresenceHealthy=False/GPULost action=RebootNode"},
		},
		{
			name: "an operator's drain is no fault of the GPU: Ready alone says it",
			feed: func(m *health.Monitor) { m.SetDrains(map[string]string{g0: "drained by olga: bad fan"}, t0) },
			want: []string{n0 + " Ready=False/AdminDrain action=Inspect", n1 + " Ready=True/Healthy"},
		},
		{
			name: "a family none of whose checks runs is Unknown; one partly run stays True",
			feed: func(m *health.Monitor) {
				m.SetCheckUnmonitored(g0, health.CheckThermal, true)
				m.SetCheckUnmonitored(g0, health.CheckSRAM, true)
				m.SetUnmonitored(g1, true)
			},
			want: []string{n0 + " Ready=True/Healthy ThermalHealthy=Unknown/NotMonitored", n1 + " Ready=True/Healthy XIDHealthy=Unknown/NotMonitored"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMonitor(t, devs)
			tc.feed(m)
			out := deviceapi.Convert(m.Snapshot(), nil, t0)
			var got []string
			for _, g := range out {
				got = append(got, summary(g))
				if len(g.GetStatus().GetConditions()) != 1+len(deviceapi.FamilyTypes()) {
					t.Errorf("%s has %d conditions, want Ready and every family", g.GetName(), len(g.GetStatus().GetConditions()))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if out[0].GetSpec().GetUuid() != g0 || out[1].GetSpec().GetUuid() != g1 {
				t.Errorf("spec.uuid %q, %q: want the UUIDs as NVML writes them", out[0].GetSpec().GetUuid(), out[1].GetSpec().GetUuid())
			}
			if msg := condition(out[0], deviceapi.TypeReady).GetMessage(); !strings.Contains(msg, tc.message) {
				t.Errorf("GPU 0's Ready message %q lacks %q", msg, tc.message)
			}
		})
	}
}

func TestConvertNamesChecksItCannotRun(t *testing.T) {
	devs := gpus(1, false)
	m := newMonitor(t, devs)
	m.SetCheckUnmonitored(devs[0].UUID, health.CheckSRAM, true)
	m.SetCheckUnmonitored(devs[0].UUID, health.CheckThermal, true)
	g := deviceapi.Convert(m.Snapshot(), nil, t0)[0]
	if msg := condition(g, deviceapi.TypeMemory).GetMessage(); !strings.HasSuffix(msg, "not monitored: sram") {
		t.Errorf("MemoryHealthy says %q: want it to name the check that does not run", msg)
	}
	if msg := condition(g, deviceapi.TypeThermal).GetMessage(); !strings.HasSuffix(msg, "on this GPU: thermal") {
		t.Errorf("ThermalHealthy says %q: want it to name the check that does not run", msg)
	}
}

// TestConvertTransitionTimes: a condition's last_transition_time is when its status changed: the
// start of its earliest fault for False, the time of the conversion for True, unchanged while
// the status holds (a second fault does not move it).
func TestConvertTransitionTimes(t *testing.T) {
	devs := gpus(1, false)
	uuid := devs[0].UUID
	m := newMonitor(t, devs)
	start := deviceapi.Convert(m.Snapshot(), nil, t0)
	prev := map[string]*v1alpha1.Gpu{start[0].GetName(): start[0]}
	at := func(g *v1alpha1.Gpu, typ string) time.Time { return condition(g, typ).GetLastTransitionTime().AsTime() }
	if got := at(start[0], deviceapi.TypeReady); !got.Equal(t0) {
		t.Errorf("before any signal, Ready changed at %v: want the time given, %v", got, t0)
	}
	step := func(s health.Signal) *v1alpha1.Gpu {
		m.Signal(s)
		g := deviceapi.Convert(m.Snapshot(), prev, s.Time)[0]
		prev[g.GetName()] = g
		return g
	}
	t1, t2, t3 := t0.Add(time.Minute), t0.Add(2*time.Minute), t0.Add(3*time.Minute)
	g := step(health.XIDSignal(uuid, 79, t1))
	if got := at(g, deviceapi.TypeReady); !got.Equal(t1) {
		t.Errorf("XID 79 at %v: Ready changed at %v", t1, got)
	}
	if got := at(g, deviceapi.TypeMemory); !got.Equal(t0) {
		t.Errorf("MemoryHealthy moved to %v without changing", got)
	}
	g = step(health.Signal{Kind: health.SignalRemappedRows, Device: uuid, Time: t2, Failure: true})
	if got := at(g, deviceapi.TypeReady); !got.Equal(t1) {
		t.Errorf("a second fault moved Ready's transition to %v, want %v", got, t1)
	}
	if got := at(g, deviceapi.TypeMemory); !got.Equal(t2) {
		t.Errorf("row remap failure at %v: MemoryHealthy changed at %v", t2, got)
	}
	// A node reboot ends both (the sim's way of repairing everything at once).
	m.Reboot("boot-2", t3)
	g = deviceapi.Convert(m.Snapshot(), prev, t3.Add(time.Second))[0]
	if summary(g) != g.GetName()+" Ready=True/Healthy" {
		t.Fatalf("after the reboot: %s", summary(g))
	}
	if got := at(g, deviceapi.TypeReady); !got.Equal(t3.Add(time.Second)) {
		t.Errorf("reboot seen at %v: Ready changed at %v", t3.Add(time.Second), got)
	}
}
