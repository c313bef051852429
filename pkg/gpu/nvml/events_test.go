package nvml_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// sig is the part of a signal an event test checks.
type sig struct {
	Kind        health.SignalKind
	XID         uint32
	Corrected   uint64
	Uncorrected uint64
	Pending     bool
	Failure     bool
	Action      health.RecoveryAction
}

func sigsOf(sigs []health.Signal, uuid string) []sig {
	var out []sig
	for _, s := range sigs {
		if s.Device != uuid {
			continue
		}
		out = append(out, sig{Kind: s.Kind, XID: s.XID, Corrected: s.Corrected, Uncorrected: s.Uncorrected,
			Pending: s.Pending, Failure: s.Failure, Action: s.Action})
	}
	return out
}

func TestEventsBecomeSignals(t *testing.T) {
	tests := []struct {
		name  string
		open  func(*gpuState) // before Open
		setup func(*gpuState)
		typ   uint64
		data  uint64
		want  []sig
	}{
		{
			name: "XID critical error",
			typ:  nvml.EventTypeXidCriticalError, data: 79,
			want: []sig{{Kind: health.SignalXID, XID: 79}},
		},
		{
			name:  "XID 154 reads the recovery action",
			setup: func(s *gpuState) { s.recovery = uint32(health.RecoveryNodeReboot) },
			typ:   nvml.EventTypeXidCriticalError, data: 154,
			want: []sig{{Kind: health.SignalXID, XID: 154}, {Kind: health.SignalRecoveryAction, Action: health.RecoveryNodeReboot}},
		},
		{
			name:  "recovery action event",
			setup: func(s *gpuState) { s.recovery = uint32(health.RecoveryDrainAndReset) },
			typ:   nvml.EventTypeGpuRecoveryAction,
			want:  []sig{{Kind: health.SignalRecoveryAction, Action: health.RecoveryDrainAndReset}},
		},
		{
			name:  "single-bit ECC error reads the totals",
			setup: func(s *gpuState) { s.corrected = 7 },
			typ:   nvml.EventTypeSingleBitEccError,
			want:  []sig{{Kind: health.SignalECCCounters, Corrected: 7}},
		},
		{
			name:  "double-bit ECC error reads the totals",
			setup: func(s *gpuState) { s.corrected, s.uncorrected = 7, 2 },
			typ:   nvml.EventTypeDoubleBitEccError,
			want:  []sig{{Kind: health.SignalECCCounters, Corrected: 7, Uncorrected: 2}},
		},
		{
			name:  "double-bit ECC error without readable totals still counts one",
			setup: func(s *gpuState) { s.failing[gpunvml.ReadingECC] = true },
			typ:   nvml.EventTypeDoubleBitEccError,
			want:  []sig{{Kind: health.SignalECCCounters, Uncorrected: 1}},
		},
		{
			name: "single-bit ECC storm",
			typ:  nvml.EventTypeSingleBitEccErrorStorm,
			want: []sig{{Kind: health.SignalECCStorm}},
		},
		{
			name:  "DRAM retirement event reads the row remapper",
			setup: func(s *gpuState) { s.rowsPending = true },
			typ:   nvml.EventTypeDramRetirementEvent,
			want:  []sig{{Kind: health.SignalRemappedRows, Pending: true}},
		},
		{
			name: "DRAM retirement event on a GPU with page retirement",
			open: func(s *gpuState) { s.arch = nvml.DEVICE_ARCH_VOLTA },
			setup: func(s *gpuState) {
				s.unsupported[gpunvml.ReadingRemappedRows] = true
				s.pagesPending = true
			},
			typ:  nvml.EventTypeDramRetirementEvent,
			want: []sig{{Kind: health.SignalRetiredPages, Pending: true}},
		},
		{
			name: "DRAM retirement failure",
			typ:  nvml.EventTypeDramRetirementFailure,
			want: []sig{{Kind: health.SignalRemappedRows, Failure: true}},
		},
		{
			name: "GPU unavailable",
			typ:  nvml.EventTypeGpuUnavailableError,
			want: []sig{{Kind: health.SignalLost}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.open != nil {
				f.update(3, tc.open)
			}
			b := f.open()
			rec := &healthtest.Recorder{}
			f.run(b, rec)
			rec.Take()
			if tc.setup != nil {
				f.update(3, tc.setup)
			}
			f.event(3, tc.typ, tc.data)
			last := tc.want[len(tc.want)-1].Kind
			got := rec.TakeUntil(t, "the event's signals", healthtest.OfKind(last, f.uuid(3)))
			if s := sigsOf(got, f.uuid(3)); !slices.Equal(s, tc.want) {
				t.Errorf("signals = %+v, want %+v", s, tc.want)
			}
			for i := range 8 {
				if i != 3 && len(sigsOf(got, f.uuid(i))) != 0 {
					t.Errorf("GPU %d got signals %+v, want none", i, sigsOf(got, f.uuid(i)))
				}
			}
			if n := b.Stats().Events; n != 1 {
				t.Errorf("Stats.Events = %d, want 1", n)
			}
		})
	}
}

func TestEventsRegisteredPerGPU(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) {
		s.supportedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypePState | nvml.EventTypeGpuUnavailableError
	})
	b := f.open()
	f.run(b, &healthtest.Recorder{})
	// Registration runs in the event loop's goroutine, not before the first sampling round.
	healthtest.Eventually(t, "the registrations", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.gpus[0].registered != 0 && f.gpus[1].registered != 0
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if got, want := f.gpus[0].registered, uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeGpuUnavailableError); got != want {
		t.Errorf("GPU 0 registered %#x, want the intersection %#x", got, want)
	}
	if got := f.gpus[1].registered; got != gpunvml.WatchedEvents {
		t.Errorf("GPU 1 registered %#x, want %#x", got, gpunvml.WatchedEvents)
	}
}

func TestRegistrationNotSupported(t *testing.T) {
	f := newFixture(t)
	migs := f.enableMIG(4, 1)
	f.update(1, func(s *gpuState) { s.unsupported["events"] = true })
	f.update(2, func(s *gpuState) { s.supportedEvents = nvml.EventTypePState })
	// Refuses every type but XIDs.
	f.update(3, func(s *gpuState) { s.refuse = gpunvml.WatchedEvents &^ nvml.EventTypeXidCriticalError })
	f.update(4, func(s *gpuState) {
		s.supportedEvents = nvml.EventTypeDoubleBitEccError
		s.refuse = nvml.EventTypeDoubleBitEccError
	})
	f.update(5, func(s *gpuState) { s.registerRet = nvml.ERROR_UNKNOWN })
	b := f.open(gpunvml.WithStartRetries(1, time.Second)) // no second try: GPU 5 stays unmonitored
	m := newMonitor(t, b)
	f.run(b, m)
	// GPUs register in order in the event loop's goroutine: GPU 7 is the last.
	healthtest.Eventually(t, "the registrations", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.gpus[7].registered != 0
	})

	want := map[string]bool{
		f.uuid(0): false, f.uuid(1): true, f.uuid(2): true, f.uuid(3): false,
		f.uuid(4): true, migs[0]: true, f.uuid(5): true,
	}
	snap := m.Snapshot()
	for uuid, unmonitored := range want {
		d, err := deviceStatus(snap, uuid)
		if err != nil {
			t.Fatalf("%s: %v", uuid, err)
		}
		if d.Unmonitored != unmonitored {
			t.Errorf("%s: Unmonitored = %v, want %v", uuid, d.Unmonitored, unmonitored)
		}
		// Visible, not unhealthy.
		if d.Health != health.Healthy {
			t.Errorf("%s: Health = %v, want Healthy", uuid, d.Health)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.gpus[3].registered; got != nvml.EventTypeXidCriticalError {
		t.Errorf("GPU 3 registered %#x, want XID only", got)
	}
}

func TestNoEventSupportAtAll(t *testing.T) {
	f := newFixture(t)
	f.eventSetRet = nvml.ERROR_NOT_SUPPORTED
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	// The event loop's goroutine says so, not before the first sampling round.
	healthtest.Eventually(t, "every GPU unmonitored for events", func() bool {
		for i := range 8 {
			if u, _ := rec.Unmonitored(f.uuid(i)); !u {
				return false
			}
		}
		return true
	})
	// Sampling goes on.
	f.step(b)
	if got := rec.Take(); !slices.ContainsFunc(got, healthtest.OfKind(health.SignalSample, f.uuid(0))) {
		t.Errorf("no sampling round without events: %v", got)
	}
}

func TestMIGAttribution(t *testing.T) {
	tests := []struct {
		name string
		// event builds the event from the GPU's handle and its MIG device handles.
		event func(gpu nvml.Device, mig func(int) nvml.Device) nvml.EventData
		// unhealthy lists the devices that become Unhealthy: -1 is the GPU, j its MIG device j.
		unhealthy []int
	}{
		{
			name: "instance IDs on the parent",
			event: func(gpu nvml.Device, _ func(int) nvml.Device) nvml.EventData {
				return nvml.EventData{Device: gpu, GpuInstanceId: 1, ComputeInstanceId: 0}
			},
			unhealthy: []int{1},
		},
		{
			name: "GPU instance, every compute instance",
			event: func(gpu nvml.Device, _ func(int) nvml.Device) nvml.EventData {
				return nvml.EventData{Device: gpu, GpuInstanceId: 2, ComputeInstanceId: health.NoInstance}
			},
			unhealthy: []int{2},
		},
		{
			name: "the MIG device's own handle",
			event: func(_ nvml.Device, mig func(int) nvml.Device) nvml.EventData {
				return nvml.EventData{Device: mig(0), GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}
			},
			unhealthy: []int{0},
		},
		{
			name: "whole GPU",
			event: func(gpu nvml.Device, _ func(int) nvml.Device) nvml.EventData {
				return nvml.EventData{Device: gpu, GpuInstanceId: health.NoInstance, ComputeInstanceId: health.NoInstance}
			},
			unhealthy: []int{-1, 0, 1, 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			migs := f.enableMIG(2, 3) // GPU instances 0, 1, 2; compute instance 0 in each
			b := f.open()
			m := newMonitor(t, b)
			f.run(b, m)
			mig := func(j int) nvml.Device {
				h, _ := f.device(2).GetMigDeviceHandleByIndex(j)
				return h
			}
			ev := tc.event(f.device(2), mig)
			ev.EventType, ev.EventData = nvml.EventTypeXidCriticalError, 48 // DBE: Unhealthy
			f.send(ev, nvml.SUCCESS)
			name := func(j int) string {
				if j < 0 {
					return f.uuid(2)
				}
				return migs[j]
			}
			healthtest.Eventually(t, "the XID", func() bool {
				d, _ := deviceStatus(m.Snapshot(), name(tc.unhealthy[0]))
				return d.Health == health.Unhealthy
			})
			snap := m.Snapshot()
			for j := -1; j < len(migs); j++ {
				d, _ := deviceStatus(snap, name(j))
				want := health.Healthy
				if slices.Contains(tc.unhealthy, j) {
					want = health.Unhealthy
				}
				if d.Health != want {
					t.Errorf("%s: Health = %v, want %v", name(j), d.Health, want)
				}
			}
		})
	}
}

func TestWaitErrorsBackOffAndRecover(t *testing.T) {
	f := newFixture(t)
	// Wait times out late here: a timeout is a successful Wait, which would end the run of
	// consecutive errors this test counts if a loaded machine delayed the next send by more than
	// the default second. (Cancellation waits for Wait to return, so not an hour either.)
	b := f.open(gpunvml.WithWaitBackoff(time.Second, 4*time.Second), gpunvml.WithEventWait(5*time.Second))
	m := newMonitor(t, b)
	f.run(b, m)

	wantBackoff := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second}
	for i, want := range wantBackoff {
		f.send(nvml.EventData{}, nvml.ERROR_UNKNOWN)
		healthtest.Eventually(t, "the wait error to be counted", func() bool { return b.Stats().WaitErrors == uint64(i+1) })
		st := b.Stats()
		if st.Backoff != want || st.ConsecutiveWaitErrors != uint64(i+1) || !strings.Contains(st.LastWaitError, "ERROR_UNKNOWN") {
			t.Errorf("after %d errors: Stats = %+v, want backoff %v", i+1, st, want)
		}
		// Nothing else is waited for until the backoff has passed.
		calls := f.waitCalls.Load()
		f.clock.Step(want - time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		if n := f.waitCalls.Load(); n != calls {
			t.Fatalf("Wait called during the backoff")
		}
		f.clock.Step(time.Millisecond)
		healthtest.Eventually(t, "the retry", func() bool { return f.waitCalls.Load() > calls })
	}
	// Recovery: events flow again and the backoff is gone.
	f.event(0, nvml.EventTypeXidCriticalError, 48)
	healthtest.Eventually(t, "the event after recovery", func() bool {
		d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
		return d.Health == health.Unhealthy
	})
	st := b.Stats()
	if st.Backoff != 0 || st.ConsecutiveWaitErrors != 0 || st.WaitErrors != 4 {
		t.Errorf("after recovery: Stats = %+v, want no backoff and 4 errors counted", st)
	}
	// Wait errors never made anything unhealthy.
	for _, d := range m.Snapshot().Devices {
		if d.Device.UUID != f.uuid(0) && d.Health != health.Healthy {
			t.Errorf("%s: Health = %v after wait errors", d.Device.UUID, d.Health)
		}
	}
}

func TestRunReturnsWhenCancelledWhileWaiting(t *testing.T) {
	tests := []struct {
		name string
		// inBackoff cancels while the loop sleeps after a Wait error rather than inside Wait.
		inBackoff bool
	}{
		{name: "inside Wait"},
		{name: "during the backoff", inBackoff: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			b := f.open(gpunvml.WithEventWait(50 * time.Millisecond))
			stop := f.run(b, &healthtest.Recorder{})
			if tc.inBackoff {
				f.send(nvml.EventData{}, nvml.ERROR_UNKNOWN)
				healthtest.Eventually(t, "the backoff", func() bool { return b.Stats().Backoff > 0 })
			} else {
				calls := f.waitCalls.Load()
				healthtest.Eventually(t, "a Wait call", func() bool { return f.waitCalls.Load() > calls })
			}
			stop() // fails the test unless Run returns and frees the event set
		})
	}
}
