package nvml_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The fixture answers as nvml.h documents: nvmlDeviceGpuRecoveryAction_t's values,
// NVML_ERROR_RESET_REQUIRED ("The GPU requires a reset before it can be used again"),
// and nvmlDeviceGetHandleByIndex_v2 / nvmlDeviceGetUUID answering NVML_ERROR_GPU_IS_LOST or
// NVML_ERROR_UNKNOWN for a GPU that fell off the bus.

func TestRecoveryActionsFromTheHeader(t *testing.T) {
	tests := []struct {
		name     string
		value    uint32 // NVML_GPU_RECOVERY_ACTION_*
		reason   string
		clearsOn health.ClearsOn
	}{
		{"RECOVER_IMEX_DOMAIN", 5, "RecoveryActionRecoverIMEXDomain", health.ClearsOnNodeReboot},
		{"BUS_RESET", 6, "RecoveryActionBusReset", health.ClearsOnGPUReset},
		{"SYSTEM_REBOOT", 7, "RecoveryActionSystemReboot", health.ClearsOnNodeReboot},
		{"a value newer than the header", 9, "RecoveryActionUnknown9", health.ClearsOnNodeReboot},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.update(0, func(s *gpuState) { s.recovery, s.corrected = tc.value, 5 })
			b := f.open()
			if a := b.Probe().GPUs[0].Readings.RecoveryAction; a == nil || uint32(*a) != tc.value {
				t.Errorf("probe: recovery action %v, want NVML's value %d", a, tc.value)
			}
			m := newMonitor(t, b)
			f.run(b, m)
			d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
			if d.Health != health.Unhealthy || len(d.Conditions) != 1 {
				t.Fatalf("Health = %v %+v, want Unhealthy from the recovery action", d.Health, d.Conditions)
			}
			c := d.Conditions[0]
			if c.Type != health.ConditionRecoveryAction || c.Reason != tc.reason || c.ClearsOn != tc.clearsOn {
				t.Fatalf("condition %+v, want reason %s, clearsOn %v", c, tc.reason, tc.clearsOn)
			}
			if tc.clearsOn != health.ClearsOnNodeReboot {
				return
			}
			// The GPU is reset (the volatile totals restart) but NVML still asks for more: the
			// condition stays, without flapping through Healthy.
			sub := m.Subscribe()
			defer sub.Close()
			sub.Next()
			f.update(0, func(s *gpuState) { s.corrected = 0 })
			f.step(b)
			if u, _ := sub.Next(); len(u.Transitions) != 0 {
				t.Errorf("a GPU reset changed health: %+v", u.Transitions)
			}
			if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); len(d.Conditions) != 1 || !d.Conditions[0].Since.Equal(c.Since) {
				t.Errorf("after a GPU reset: %+v, want the condition unchanged", d.Conditions)
			}
		})
	}
}

func TestResetRequired(t *testing.T) {
	t.Run("a reading answers it: the round ends, the GPU is Unhealthy until reset", func(t *testing.T) {
		f := newFixture(t)
		f.update(3, func(s *gpuState) { s.corrected = 5 })
		b := f.open()
		m := newMonitor(t, b)
		rec := &healthtest.Recorder{}
		f.run(b, teeSink{rec, m})
		rec.Take()
		// The temperature answers it: what the round read before no longer counts.
		f.update(3, func(s *gpuState) { s.rets[gpunvml.ReadingTemperature] = nvml.ERROR_RESET_REQUIRED })
		f.step(b)
		if s := sigsOf(rec.Take(), f.uuid(3)); !slices.Equal(s, []sig{{Kind: health.SignalResetRequired}}) {
			t.Errorf("GPU 3 signals = %+v, want only resetRequired", s)
		}
		d, _ := deviceStatus(m.Snapshot(), f.uuid(3))
		if d.Health != health.Unhealthy || len(d.Conditions) != 1 ||
			d.Conditions[0].Type != health.ConditionGPUResetRequired || d.Conditions[0].ClearsOn != health.ClearsOnGPUReset {
			t.Fatalf("Health = %v %+v, want Unhealthy until a GPU reset", d.Health, d.Conditions)
		}
		if n := b.Stats().SampleErrors; n != 0 {
			t.Errorf("Stats.SampleErrors = %d: a GPU that needs a reset is not a failed reading", n)
		}
		r := b.Probe().GPUs[3].Readings
		if !r.ResetRequired || len(r.Errors) != 1 || !strings.Contains(r.Errors[0], "RESET_REQUIRED") || r.Temperature != nil {
			t.Errorf("probe readings %+v, want only the reset-required error", r)
		}
		// The GPU is reset: readings work again and the volatile totals restart.
		f.update(3, func(s *gpuState) { s.rets[gpunvml.ReadingTemperature], s.corrected = nvml.SUCCESS, 0 })
		f.step(b)
		if d, _ := deviceStatus(m.Snapshot(), f.uuid(3)); d.Health != health.Healthy {
			t.Errorf("after the reset: %v %+v, want Healthy", d.Health, d.Conditions)
		}
	})
	t.Run("after an event", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		f.update(2, func(s *gpuState) { s.resetRequired = true })
		f.event(2, nvml.EventTypeXidCriticalError, 154)
		got := rec.TakeUntil(t, "resetRequired", healthtest.OfKind(health.SignalResetRequired, f.uuid(2)))
		want := []sig{{Kind: health.SignalXID, XID: 154}, {Kind: health.SignalResetRequired}}
		if s := sigsOf(without(got, health.SignalSample), f.uuid(2)); !slices.Equal(s, want) {
			t.Errorf("GPU 2 signals = %+v, want %+v", s, want)
		}
	})
	t.Run("at registration", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		f.update(1, func(s *gpuState) { s.resetRequired = true })
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		if got := rec.Take(); !slices.ContainsFunc(got, healthtest.OfKind(health.SignalResetRequired, f.uuid(1))) ||
			slices.ContainsFunc(got, healthtest.OfKind(health.SignalLost, f.uuid(1))) {
			t.Errorf("GPU 1: %v, want resetRequired and not lost", kindsBy(got)[f.uuid(1)])
		}
	})
	t.Run("Wait answers it without saying which GPU", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		rec.Take()
		// Its readings answer it; the UUID still comes.
		f.update(4, func(s *gpuState) { s.resetRequired = true })
		f.send(nvml.EventData{}, nvml.ERROR_RESET_REQUIRED)
		got := rec.TakeUntil(t, "resetRequired", healthtest.OfKind(health.SignalResetRequired, f.uuid(4)))
		if kinds := kindsBy(got); len(kinds) != 1 {
			t.Errorf("signals = %v, want only GPU 4", kinds)
		}
	})
}

func TestOpenLeavesOutABrokenGPUItCannotName(t *testing.T) {
	handle := func(ret nvml.Return) func(*fixture) {
		return func(f *fixture) {
			get := f.srv.DeviceGetHandleByIndexFunc
			f.srv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
				if i == 5 {
					return nil, ret
				}
				return get(i)
			}
		}
	}
	uuid := func(ret nvml.Return) func(*fixture) {
		return func(f *fixture) { f.update(5, func(s *gpuState) { s.rets["uuid"] = ret }) }
	}
	tests := []struct {
		name   string
		setup  func(*fixture)
		ret    nvml.Return
		broken bool
		pci    bool // the error names the GPU by its PCI bus ID
	}{
		{"handle: GPU_IS_LOST", handle(nvml.ERROR_GPU_IS_LOST), nvml.ERROR_GPU_IS_LOST, true, false},
		{"handle: UNKNOWN", handle(nvml.ERROR_UNKNOWN), nvml.ERROR_UNKNOWN, true, false},
		{"handle: RESET_REQUIRED", handle(nvml.ERROR_RESET_REQUIRED), nvml.ERROR_RESET_REQUIRED, true, false},
		{"UUID: GPU_IS_LOST", uuid(nvml.ERROR_GPU_IS_LOST), nvml.ERROR_GPU_IS_LOST, true, true},
		{"UUID: RESET_REQUIRED", uuid(nvml.ERROR_RESET_REQUIRED), nvml.ERROR_RESET_REQUIRED, true, true},
		{"handle: NO_PERMISSION is not a broken GPU", handle(nvml.ERROR_NO_PERMISSION), nvml.ERROR_NO_PERMISSION, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(f)
			var logs healthtest.Log
			b := f.open(gpunvml.WithLogger(logs.Logger()))
			if n := len(b.Devices()); n != 7 {
				t.Errorf("got %d devices, want 7", n)
			}
			sk := b.Skipped()
			if len(sk) != 1 || !errors.Is(sk[0], tc.ret) || errors.Is(sk[0], gpunvml.ErrGPULost) != tc.broken {
				t.Fatalf("Skipped = %v, want one error wrapping %v (ErrGPULost: %v)", sk, tc.ret, tc.broken)
			}
			if msg := sk[0].Error(); !strings.Contains(msg, "GPU 5") || strings.Contains(msg, f.device(5).PciBusID) != tc.pci {
				t.Errorf("Skipped error %q, want GPU 5 named (by PCI bus ID: %v)", msg, tc.pci)
			}
			want := []string{"GPU 5", "left out of the inventory"}
			if tc.broken {
				want = append(want, "cannot be tracked or marked Unhealthy")
			}
			if got := logs.Containing(want...); len(got) != 1 {
				t.Errorf("log lines about GPU 5: %q, want one saying %q", got, want)
			}
			if rep := b.Probe(); len(rep.Skipped) != 1 {
				t.Errorf("probe skipped %v, want GPU 5", rep.Skipped)
			}
		})
	}
}

func TestOpenMarksAGPUBrokenWhileOpening(t *testing.T) {
	for _, kind := range []struct {
		ret    nvml.Return
		signal health.SignalKind
		cond   health.ConditionType
	}{
		{nvml.ERROR_GPU_IS_LOST, health.SignalLost, health.ConditionGPULost},
		{nvml.ERROR_RESET_REQUIRED, health.SignalResetRequired, health.ConditionGPUResetRequired},
	} {
		t.Run(kind.ret.Error(), func(t *testing.T) {
			f := newFixture(t)
			// The UUID is known, but the GPU breaks while Open reads its attributes; the
			// readings that follow may or may not notice, Run reports it first.
			f.device(1).GetMinorNumberFunc = func() (int, nvml.Return) { return 0, kind.ret }
			b := f.open()
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			if s := sigsOf(rec.Take(), f.uuid(1)); len(s) == 0 || s[0].Kind != kind.signal {
				t.Errorf("GPU 1 signals = %+v, want %v first", s, kind.signal)
			}
			d, _ := deviceStatus(m.Snapshot(), f.uuid(1))
			if d.Health != health.Unhealthy || len(d.Conditions) != 1 || d.Conditions[0].Type != kind.cond {
				t.Errorf("Health = %v %+v, want Unhealthy from %s", d.Health, d.Conditions, kind.cond)
			}
		})
	}
}
