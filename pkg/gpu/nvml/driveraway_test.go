package nvml_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The driver going away under a running backend (an upgrade, a driver container restart): Run
// ends with a *DriverGoneError, every GPU unmonitored and no signal that would change a GPU's
// health; the event set is freed.
func TestDriverGoneEndsRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		// cut makes the driver go away with ret; answer switches nvmlSystemGetDriverVersion.
		cut func(f *fixture, answer func(nvml.Return), ret nvml.Return)
		ret nvml.Return
		op  string
	}{
		{
			name: "the sampler's round finds the module replaced by another version",
			cut:  func(f *fixture, answer func(nvml.Return), ret nvml.Return) { answer(ret); f.clock.Step(samplePeriod) },
			ret:  nvml.ERROR_LIB_RM_VERSION_MISMATCH, op: "asking the driver its version",
		},
		{
			name: "the sampler's round finds the driver unloaded",
			cut:  func(f *fixture, answer func(nvml.Return), ret nvml.Return) { answer(ret); f.clock.Step(samplePeriod) },
			ret:  nvml.ERROR_DRIVER_NOT_LOADED, op: "asking the driver its version",
		},
		{
			name: "EventSet.Wait answers that the session died",
			cut:  func(f *fixture, _ func(nvml.Return), ret nvml.Return) { f.send(nvml.EventData{}, ret) },
			ret:  nvml.ERROR_UNINITIALIZED, op: "waiting for NVML events",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			answer := f.driverAnswers()
			b := f.open()
			rec := &healthtest.Recorder{}
			done := f.runToEnd(b, rec)
			rec.Take()

			tc.cut(f, answer, tc.ret)
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not end after the driver went away")
			}
			var gone *gpunvml.DriverGoneError
			if !errors.As(err, &gone) || !errors.Is(err, gpunvml.ErrDriverGone) || !errors.Is(err, tc.ret) {
				t.Fatalf("Run = %v, want a *DriverGoneError wrapping ErrDriverGone and %v", err, tc.ret)
			}
			if gone.Op != tc.op || !gone.At.Equal(f.clock.Now()) {
				t.Errorf("DriverGoneError = {Op: %q, At: %v}, want {%q, %v}", gone.Op, gone.At, tc.op, f.clock.Now())
			}
			if got := b.DriverGone(); got != gone {
				t.Errorf("DriverGone() = %v, want the error Run returned", got)
			}
			if b.Stats().DriverGone == "" {
				t.Error("Stats().DriverGone is empty")
			}
			for i := range f.gpus {
				if u, known := rec.Unmonitored(f.uuid(i)); !u || !known {
					t.Errorf("GPU %d not marked unmonitored", i)
				}
			}
			// Nothing that would move a GPU's health: the driver going is no news about them.
			if sigs := without(rec.Take(), health.SignalSample); len(sigs) > 0 {
				t.Errorf("signals after the driver went away: %v", sigs)
			}
			if c, fr := f.creates.Load(), f.frees.Load(); c != fr {
				t.Errorf("%d event sets created, %d freed: want every one freed", c, fr)
			}
		})
	}
}

// An ordinary failure of Wait is retried, as before: only the driver's own words end Run.
func TestWaitFailureThatIsNotTheDriverKeepsRunning(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	f.send(nvml.EventData{}, nvml.ERROR_UNKNOWN)
	f.stepUntil("a new event set", time.Second, func() bool { return b.Stats().EventSetRebuilds == 1 })
	if b.DriverGone() != nil {
		t.Errorf("DriverGone() = %v after ERROR_UNKNOWN", b.DriverGone())
	}
}

// driverAnswers returns a switch: from its call on, nvmlSystemGetDriverVersion answers the
// return it was given (SUCCESS: the driver's version).
func (f *fixture) driverAnswers() func(nvml.Return) {
	var answer atomic.Int32
	orig := f.srv.SystemGetDriverVersionFunc
	f.srv.SystemGetDriverVersionFunc = func() (string, nvml.Return) {
		if r := nvml.Return(answer.Load()); r != nvml.SUCCESS {
			return "", r
		}
		return orig()
	}
	return func(ret nvml.Return) { answer.Store(int32(ret)) }
}

// runToEnd starts b.Run, waits for its first sampling round and its first Wait, and returns
// where Run's result comes: for tests in which Run ends by itself (its context ends with the
// test).
func (f *fixture) runToEnd(b *gpunvml.Backend, sink gpuapi.Sink) <-chan error {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, sink) }()
	healthtest.Eventually(f.t, "the first sampling round", func() bool { return b.Stats().Rounds >= 1 })
	healthtest.Eventually(f.t, "the first Wait", func() bool { return f.waitCalls.Load() > 0 })
	return done
}

// A driver that goes away while NVML is down after a reset (the reset overlapped a driver
// upgrade): Init answers the driver's absence, and Run ends with a *DriverGoneError instead of
// retrying in this process for ever.
func TestDriverGoneWhileNVMLIsDownAfterAReset(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	done := f.runToEnd(b, rec)
	r := f.resetter(b, func(context.Context, []string) ([]byte, error) {
		f.mu.Lock()
		f.initRets = []nvml.Return{nvml.ERROR_LIB_RM_VERSION_MISMATCH}
		f.mu.Unlock()
		return nil, nil
	})
	if err := r.Reset(t.Context(), f.uuid(0)); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end after Init said the driver is another version")
	}
	var gone *gpunvml.DriverGoneError
	if !errors.As(err, &gone) || gone.Ret != nvml.ERROR_LIB_RM_VERSION_MISMATCH {
		t.Fatalf("Run = %v, want a *DriverGoneError with LIB_RM_VERSION_MISMATCH", err)
	}
}

// The driver already gone when the event set is first made (killed between Open and Run):
// Run ends with a *DriverGoneError, not after every start attempt with a generic error.
func TestDriverGoneAtTheFirstEventSet(t *testing.T) {
	f := newFixture(t)
	f.mu.Lock()
	f.createRets = []nvml.Return{nvml.ERROR_LIB_RM_VERSION_MISMATCH}
	f.mu.Unlock()
	b := f.open()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, &healthtest.Recorder{}) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not end")
	}
	if !errors.Is(err, gpunvml.ErrDriverGone) || !errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) || f.creates.Load() != 0 {
		t.Errorf("Run = %v after %d event sets, want ErrDriverGone with LIB_RM_VERSION_MISMATCH at the first", err, f.creates.Load())
	}
}
