package nvml_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// The tests of a reset's hand-over of NVML: the fixture fails a test that calls NVML while it
// is shut down (see fixture.checkLive), and the command is a function that looks at NVML while
// it "runs".

// resetter returns b's CommandResetter running cmd instead of a command; cmd gets the argv.
func (f *fixture) resetter(b *gpunvml.Backend, cmd func(ctx context.Context, argv []string) ([]byte, error)) gpuapi.Resetter {
	f.t.Helper()
	r, err := b.CommandResetter([]string{"nvidia-smi", "--gpu-reset", "-i", "{uuid}"})
	if err != nil {
		f.t.Fatal(err)
	}
	gpunvml.SetResetRunner(r, cmd)
	return r
}

// runLoops is how many of Run's loops use NVML and park during a reset: the event loop and
// the sampler.
const runLoops = 2

// expectReleased fails the test unless NVML is shut down with every event set freed.
func (f *fixture) expectReleased(when string) {
	f.t.Helper()
	if f.live.Load() {
		f.t.Errorf("%s: NVML is initialised, want it shut down", when)
	}
	if c, fr := f.creates.Load(), f.frees.Load(); c != fr {
		f.t.Errorf("%s: %d event sets created, %d freed: want every one freed", when, c, fr)
	}
}

// index returns the position of call in log at or after from, or fails the test.
func index(t *testing.T, log []string, from int, call string) int {
	t.Helper()
	i := slices.Index(log[from:], call)
	if i < 0 {
		t.Fatalf("no %q after position %d in %v", call, from, log)
	}
	return from + i
}

// waitWatching waits until an event set made after the reset (the creation after position from
// of the call log) has every GPU not in skip registered on it.
func (f *fixture) waitWatching(from int, skip ...int) {
	f.t.Helper()
	healthtest.Eventually(f.t, "the event set made anew with the GPUs registered", func() bool {
		log := f.callLog()
		if !slices.Contains(log[from:], "create") || f.waitCalls.Load() == 0 {
			return false
		}
		set := f.lastSet()
		for i := range f.gpus {
			if (f.registeredOn(set, i) != 0) == slices.Contains(skip, i) {
				return false
			}
		}
		return true
	})
}

func TestResetLetsGoOfNVMLWhileTheCommandRuns(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	before := len(f.callLog())
	rounds := b.Stats().Rounds
	var ran atomic.Int32
	r := f.resetter(b, func(_ context.Context, argv []string) ([]byte, error) {
		ran.Add(1)
		f.record("command")
		if got, want := strings.Join(argv, " "), "nvidia-smi --gpu-reset -i "+f.uuid(1); got != want {
			t.Errorf("command %q, want %q", got, want)
		}
		f.expectReleased("while the command runs")
		// A sampling round falls due while the command runs: the sampler must wait (the
		// fixture fails any NVML call now), and so must the event loop.
		f.clock.Step(samplePeriod)
		healthtest.Eventually(t, "the event loop and the sampler parked", func() bool { return gpunvml.ParkedLoops(b) == runLoops })
		return []byte("GPU 00000000:1B:00.0 was successfully reset."), nil
	})
	rec.Take()
	if err := r.Reset(t.Context(), f.uuid(1)); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	if ran.Load() != 1 {
		t.Fatalf("command ran %d times, want once", ran.Load())
	}
	f.waitWatching(before)

	log := f.callLog()[before:]
	free := index(t, log, 0, "free")
	shutdown := index(t, log, free, "shutdown")
	command := index(t, log, shutdown, "command")
	initAt := index(t, log, command, "init")
	last := initAt
	for i := range f.gpus {
		last = max(last, index(t, log, initAt, fmt.Sprintf("handle %d", i)))
	}
	index(t, log, last, "create")
	if n := f.shutdowns.Load(); n != 1 {
		t.Errorf("Shutdown called %d times, want once", n)
	}

	// The round that fell due during the reset runs once NVML is back, and reports the reset.
	sigs := rec.TakeUntil(t, "the reset reported", healthtest.OfKind(health.SignalReset, f.uuid(1)))
	// A round is counted once its signals are out: wait for the count, not just the signals.
	healthtest.Eventually(t, "a sampling round after the reset", func() bool { return b.Stats().Rounds > rounds })
	if kinds := kindsOf(sigs, f.uuid(1)); kinds[0] != health.SignalReset {
		t.Errorf("GPU 1 signals %v, want the reset first", kinds)
	}
	for i := range f.gpus {
		if unmonitored, _ := rec.Unmonitored(f.uuid(i)); unmonitored {
			t.Errorf("GPU %d unmonitored after the reset", i)
		}
	}
	// The new event set delivers events.
	f.event(3, nvml.EventTypeXidCriticalError, 79)
	rec.TakeUntil(t, "an XID on the new event set", healthtest.OfKind(health.SignalXID, f.uuid(3)))
}

func TestResetOfAGPUThatDoesNotComeBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		ret  nvml.Return
	}{
		{"not found", nvml.ERROR_NOT_FOUND},
		{"lost", nvml.ERROR_GPU_IS_LOST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			b := f.open()
			rec := &healthtest.Recorder{}
			f.run(b, rec)
			before := len(f.callLog())
			r := f.resetter(b, func(context.Context, []string) ([]byte, error) {
				f.update(2, func(s *gpuState) { s.gone, s.lost = tc.ret, true })
				return nil, nil
			})
			if err := r.Reset(t.Context(), f.uuid(2)); err != nil {
				t.Fatalf("Reset: %v", err)
			}
			f.waitWatching(before, 2)
			rec.Take()
			f.step(b)
			sigs := rec.Take()
			if kinds := kindsOf(sigs, f.uuid(2)); !slices.Contains(kinds, health.SignalLost) {
				t.Errorf("GPU 2 signals %v, want it lost", kinds)
			}
			if kinds := kindsOf(sigs, f.uuid(0)); slices.Contains(kinds, health.SignalLost) || !slices.Contains(kinds, health.SignalSample) {
				t.Errorf("GPU 0 signals %v, want a normal round", kinds)
			}
			// An event whose handle matches no GPU probes them: GPU 2, without a handle, is
			// lost; the others answer.
			rec.Take()
			f.send(nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79}, nvml.SUCCESS)
			sigs = rec.TakeUntil(t, "GPU 2 lost again", healthtest.OfKind(health.SignalLost, f.uuid(2)))
			for _, s := range without(sigs, health.SignalSample) {
				if s.Device != f.uuid(2) {
					t.Errorf("signal %v for a GPU that came back", s)
				}
			}
		})
	}
}

func TestInitFailingAfterResetIsRetriedWithBackoff(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	before := len(f.callLog())
	r := f.resetter(b, func(context.Context, []string) ([]byte, error) {
		f.mu.Lock()
		f.initRets = []nvml.Return{nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN}
		f.mu.Unlock()
		return nil, nil
	})
	// The GPU was reset: NVML failing afterwards does not undo that.
	if err := r.Reset(t.Context(), f.uuid(0)); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	resetAt := f.clock.Now()
	healthtest.Eventually(t, "every GPU unmonitored", func() bool {
		for i := range f.gpus {
			if unmonitored, _ := rec.Unmonitored(f.uuid(i)); !unmonitored {
				return false
			}
		}
		return true
	})
	// Tries again only as the clock moves: Open's Init and the reset's.
	if n := f.initCalls(); n != 2 {
		t.Fatalf("Init called %d times before the backoff passed, want 2", n)
	}
	// Sampling rounds fall due meanwhile: nothing may call NVML (the fixture checks).
	f.stepUntil("NVML initialised again", time.Second, func() bool { return f.initCalls() == 4 && f.live.Load() })
	f.waitWatching(before)
	healthtest.Eventually(t, "every GPU monitored again", func() bool {
		for i := range f.gpus {
			if unmonitored, _ := rec.Unmonitored(f.uuid(i)); unmonitored {
				return false
			}
		}
		return true
	})
	if elapsed := f.clock.Since(resetAt); elapsed < 3*time.Second {
		t.Errorf("NVML initialised again %v after the failure, want the backoff (1s, then 2s) waited", elapsed)
	}
	log := f.callLog()[before:]
	if n := slices.Index(log, "init"); n < 0 || strings.Count(strings.Join(log[:n], ","), "init failed") != 2 {
		t.Errorf("calls %v, want two failed Inits before the one that worked", log)
	}
	f.step(b)
	rec.TakeUntil(t, "the reset reported once NVML is back", healthtest.OfKind(health.SignalReset, f.uuid(0)))
	f.event(1, nvml.EventTypeXidCriticalError, 48)
	rec.TakeUntil(t, "an XID on the new event set", healthtest.OfKind(health.SignalXID, f.uuid(1)))
}

func TestResetCancelled(t *testing.T) {
	t.Run("while the command runs", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		before := len(f.callLog())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		r := f.resetter(b, func(ctx context.Context, _ []string) ([]byte, error) {
			cancel()
			<-ctx.Done()
			return []byte("killed"), errors.New("signal: killed")
		})
		err := r.Reset(ctx, f.uuid(4))
		if err == nil || !strings.Contains(err.Error(), "signal: killed") {
			t.Fatalf("Reset: %v, want the command's failure", err)
		}
		// NVML is taken back whatever the command did.
		f.waitWatching(before)
		rec.Take()
		f.step(b)
		if slices.Contains(kindsOf(rec.Take(), f.uuid(4)), health.SignalReset) {
			t.Error("a cancelled reset was reported as a reset")
		}
		f.event(4, nvml.EventTypeXidCriticalError, 79)
		rec.TakeUntil(t, "an XID after the cancelled reset", healthtest.OfKind(health.SignalXID, f.uuid(4)))
	})
	t.Run("before NVML is let go", func(t *testing.T) {
		f := newFixture(t)
		b := f.open()
		rec := &healthtest.Recorder{}
		f.run(b, rec)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r := f.resetter(b, func(context.Context, []string) ([]byte, error) {
			t.Error("the command ran after the reset was cancelled")
			return nil, nil
		})
		if err := r.Reset(ctx, f.uuid(4)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Reset: %v, want context.Canceled", err)
		}
		if n := f.shutdowns.Load(); n != 0 {
			t.Errorf("Shutdown called %d times, want none", n)
		}
		f.event(4, nvml.EventTypeXidCriticalError, 79)
		rec.TakeUntil(t, "an XID on the same event set", healthtest.OfKind(health.SignalXID, f.uuid(4)))
		if n := f.creates.Load(); n != 1 {
			t.Errorf("%d event sets created, want the first one kept", n)
		}
	})
}

func TestConcurrentResetsAreSerialised(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	var active atomic.Int32
	release, started := make(chan struct{}), make(chan string, 3)
	r := f.resetter(b, func(_ context.Context, argv []string) ([]byte, error) {
		if active.Add(1) > 1 {
			t.Error("two reset commands ran at once")
		}
		defer active.Add(-1)
		uuid := argv[len(argv)-1]
		f.record("command " + uuid)
		f.expectReleased("command " + uuid)
		started <- uuid
		if uuid == f.uuid(0) {
			<-release
		}
		return nil, nil
	})
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = r.Reset(t.Context(), f.uuid(0)) }()
	if got := <-started; got != f.uuid(0) {
		t.Fatalf("command for %s, want %s", got, f.uuid(0))
	}
	// A reset that gives up while the first runs never gets as far as NVML.
	ctx, cancel := context.WithCancel(t.Context())
	wg.Add(1)
	go func() { defer wg.Done(); errs[1] = r.Reset(ctx, f.uuid(1)) }()
	cancel()
	wg.Add(1)
	go func() { defer wg.Done(); errs[2] = r.Reset(t.Context(), f.uuid(2)) }()
	close(release)
	wg.Wait()
	if errs[0] != nil || errs[2] != nil {
		t.Fatalf("resets: %v, %v", errs[0], errs[2])
	}
	if !errors.Is(errs[1], context.Canceled) || !strings.Contains(errs[1].Error(), "waiting for another reset") {
		t.Errorf("cancelled reset: %v, want it cancelled while waiting for the first", errs[1])
	}
	log := f.callLog()
	first := index(t, log, 0, "command "+f.uuid(0))
	second := index(t, log, index(t, log, index(t, log, first, "init"), "shutdown"), "command "+f.uuid(2))
	if slices.Contains(log, "command "+f.uuid(1)) {
		t.Errorf("the cancelled reset ran its command: %v", log)
	}
	index(t, log, second, "init")
	if n := f.shutdowns.Load(); n != 2 {
		t.Errorf("Shutdown called %d times, want once per reset that ran", n)
	}
}

func TestResetAfterClose(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	r := f.resetter(b, func(context.Context, []string) ([]byte, error) {
		t.Error("the command ran after Close")
		return nil, nil
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Reset(t.Context(), f.uuid(0)); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Reset after Close: %v", err)
	}
}
