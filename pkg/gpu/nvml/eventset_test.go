package nvml_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// nvml.h, nvmlDeviceRegisterEvents: "If function reports NVML_ERROR_UNKNOWN, event set is in
// undefined state and should be freed. If function reports NVML_ERROR_NOT_SUPPORTED, event set
// can still be used. None of the requested eventTypes are registered in that case."

func TestRegistrationTypeByType(t *testing.T) {
	f := newFixture(t)
	// GPU 1 refuses one type it lists as supported: a mask with it answers NOT_SUPPORTED.
	f.update(1, func(s *gpuState) { s.refuse = nvml.EventTypeDramRetirementFailure })
	b := f.open()
	m := newMonitor(t, b)
	f.run(b, m)
	want := gpunvml.WatchedEvents &^ nvml.EventTypeDramRetirementFailure
	if got := f.registeredOn(f.lastSet(), 1); got != want {
		t.Errorf("GPU 1 registered %v, want %v", gpunvml.EventNames(got), gpunvml.EventNames(want))
	}
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(1)); d.Unmonitored {
		t.Error("GPU 1 is unmonitored")
	}
}

func TestEventSetMadeAnewAfterUnknown(t *testing.T) {
	t.Run("Wait answers ERROR_UNKNOWN", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		m := newMonitor(t, b)
		f.run(b, m)
		first := f.lastSet()
		f.send(nvml.EventData{}, nvml.ERROR_UNKNOWN)
		f.stepUntil("a new event set", time.Second, func() bool { return b.Stats().EventSetRebuilds == 1 })
		second := f.lastSet()
		f.mu.Lock()
		freed := first.freed
		f.mu.Unlock()
		if !freed || second == first || f.creates.Load() != 2 {
			t.Fatalf("first set freed %v, %d sets created: want it freed and a second one", freed, f.creates.Load())
		}
		for i := range f.gpus {
			if got := f.registeredOn(second, i); got != gpunvml.WatchedEvents {
				t.Errorf("GPU %d registered %#x on the new set, want %#x", i, got, gpunvml.WatchedEvents)
			}
		}
		// Events flow from the new set.
		f.event(0, nvml.EventTypeXidCriticalError, 48)
		healthtest.Eventually(t, "the event", func() bool {
			d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
			return d.Health == health.Unhealthy
		})
	})
	t.Run("RegisterEvents answers ERROR_UNKNOWN at start, once", func(t *testing.T) {
		f := newFixture(t)
		f.update(5, func(s *gpuState) { s.registerRets = []nvml.Return{nvml.ERROR_UNKNOWN} })
		b := f.open(gpunvml.WithStartRetries(3, time.Second))
		m := newMonitor(t, b)
		f.run(b, m)
		// The set GPU 5 broke is freed at once and the others registered on a new one; GPU 5
		// failed, so the start is tried again after the backoff, and then every GPU registers.
		f.stepUntil("every GPU registered", time.Second, func() bool {
			return f.creates.Load() == 3 && f.registeredOn(f.lastSet(), 7) != 0 && f.waitCalls.Load() > 0
		})
		last := f.lastSet()
		for i := range f.gpus {
			if got := f.registeredOn(last, i); got != gpunvml.WatchedEvents {
				t.Errorf("GPU %d registered %#x, want %#x", i, got, gpunvml.WatchedEvents)
			}
		}
		if n := f.frees.Load(); n != 2 {
			t.Errorf("%d event sets freed, want the 2 before the last", n)
		}
		if d, _ := deviceStatus(m.Snapshot(), f.uuid(5)); d.Unmonitored {
			t.Error("GPU 5 is unmonitored")
		}
	})
}

func TestEventSetStartRetries(t *testing.T) {
	t.Run("creation fails twice, then works", func(t *testing.T) {
		f := newFixture(t)
		f.createRets = []nvml.Return{nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN}
		b := f.open(gpunvml.WithStartRetries(3, time.Second))
		m := newMonitor(t, b)
		f.run(b, m)
		// The next try waits for the injected clock, not for real time.
		healthtest.Eventually(t, "the first try", func() bool { return len(f.srv.EventSetCreateCalls()) == 1 })
		time.Sleep(20 * time.Millisecond)
		if n := len(f.srv.EventSetCreateCalls()); n != 1 {
			t.Fatalf("EventSetCreate called %d times before the clock moved, want 1", n)
		}
		f.stepUntil("events", time.Second, func() bool { return f.waitCalls.Load() > 0 })
		if n := len(f.srv.EventSetCreateCalls()); n != 3 {
			t.Errorf("EventSetCreate called %d times, want 3", n)
		}
		f.event(0, nvml.EventTypeXidCriticalError, 48)
		healthtest.Eventually(t, "the event", func() bool {
			d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
			return d.Health == health.Unhealthy
		})
	})
	t.Run("creation keeps failing: Run gives up with the error", func(t *testing.T) {
		f := newFixture(t)
		f.eventSetRet = nvml.ERROR_UNKNOWN
		b := f.open(gpunvml.WithStartRetries(3, time.Second))
		done := make(chan error, 1)
		go func() { done <- b.Run(context.Background(), &healthtest.Recorder{}) }()
		var err error
		f.stepUntil("Run to return", time.Second, func() bool {
			select {
			case err = <-done:
				return true
			default:
				return false
			}
		})
		if !errors.Is(err, nvml.ERROR_UNKNOWN) {
			t.Errorf("Run = %v, want an error wrapping ERROR_UNKNOWN", err)
		}
		if n := len(f.srv.EventSetCreateCalls()); n != 3 {
			t.Errorf("EventSetCreate called %d times, want 3", n)
		}
	})
}
