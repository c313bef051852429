package report_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// countingSyncer records the snapshots it is asked to sync and fails while fail is set.
type countingSyncer struct {
	mu    sync.Mutex
	calls []health.Snapshot
	fail  int
}

func (s *countingSyncer) Name() string { return "counting" }

func (s *countingSyncer) Sync(_ context.Context, snap health.Snapshot) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, snap)
	if s.fail > 0 {
		s.fail--
		return 0, errors.New("conflict")
	}
	return 1, nil
}

func (s *countingSyncer) snapshot() []health.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]health.Snapshot(nil), s.calls...)
}

func (s *countingSyncer) failNext(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = n
}

type observer struct {
	mu             sync.Mutex
	writes, errors int
}

func (o *observer) ObserveSync(_ string, writes int, _ time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.writes += writes
	if err != nil {
		o.errors++
	}
}

// timerClock is a fake clock that tells the test every timer the Writer's queue arms, and for
// how long: a retry's backoff or the wait for the next resync. The queue arms the timer after the
// Sync before it has returned, so a test that has read a timer knows the Writer is idle until
// the clock reaches it, and steps the clock instead of sleeping.
type timerClock struct {
	*clocktesting.FakeClock
	timers chan time.Duration
}

func newTimerClock() *timerClock {
	return &timerClock{FakeClock: clocktesting.NewFakeClock(time.Unix(1000, 0)), timers: make(chan time.Duration, 100)}
}

func (c *timerClock) NewTimer(d time.Duration) clock.Timer {
	t := c.FakeClock.NewTimer(d)
	c.timers <- d
	return t
}

// nextTimer returns the duration of the next timer the Writer arms.
func (c *timerClock) nextTimer(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-c.timers:
		return d
	case <-time.After(30 * time.Second): // only reached when the Writer is stuck
		t.Fatal("the Writer armed no timer")
		return 0
	}
}

// run runs w until the test ends and waits for it to return.
func run(t *testing.T, w *report.Writer) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ctx
}

func TestWriterCoalescesToTheLatestSnapshot(t *testing.T) {
	s := &countingSyncer{}
	clk := newTimerClock()
	w := report.NewWriter(s, report.WriterOptions{Resync: time.Hour, Clock: clk})
	// Reports before Run starts pile up; the worker must sync only the last one.
	for i := range 1000 {
		_ = w.Report(context.Background(), health.Snapshot{Time: time.Unix(int64(i), 0)})
	}
	run(t, w)
	if d := clk.nextTimer(t); d != time.Hour {
		t.Fatalf("after the sync the Writer waits %v, want the resync period (1h)", d)
	}
	calls := s.snapshot()
	if len(calls) != 1 {
		t.Fatalf("%d syncs for 1000 coalesced reports, want 1", len(calls))
	}
	if got := calls[0].Time.Unix(); got != 999 {
		t.Errorf("synced snapshot %d, want the latest (999)", got)
	}
	if !w.Synced() {
		t.Error("Synced() = false after a successful sync")
	}
}

func TestWriterRetriesFailedSyncsWithBackoff(t *testing.T) {
	s := &countingSyncer{fail: 3}
	o := &observer{}
	clk := newTimerClock()
	w := report.NewWriter(s, report.WriterOptions{Resync: time.Hour, BaseDelay: time.Second, MaxDelay: 2 * time.Second, Clock: clk, Observer: o})
	ctx := run(t, w)
	_ = w.Report(ctx, health.Snapshot{})
	// Each failure waits twice as long as the one before, up to MaxDelay; the first success
	// waits for the resync.
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 2 * time.Second, time.Hour} {
		if d := clk.nextTimer(t); d != want {
			t.Fatalf("after sync %d the Writer waits %v, want %v", i+1, d, want)
		}
		if n := len(s.snapshot()); n != i+1 {
			t.Fatalf("%d sync attempts before the clock reached the wait after sync %d", n, i+1)
		}
		if want != time.Hour {
			clk.Step(want)
		}
	}
	if !w.Synced() {
		t.Error("Synced() = false after a successful sync")
	}
	o.mu.Lock()
	if o.errors != 3 || o.writes != 1 {
		t.Errorf("observed %d errors and %d writes, want 3 and 1", o.errors, o.writes)
	}
	o.mu.Unlock()

	// A success forgets the failures: the next failure starts at BaseDelay again.
	s.failNext(1)
	w.Trigger()
	if d := clk.nextTimer(t); d != time.Second {
		t.Errorf("a failure after a success waits %v, want BaseDelay (1s)", d)
	}
}

func TestWriterResyncsPeriodically(t *testing.T) {
	s := &countingSyncer{}
	clk := newTimerClock()
	w := report.NewWriter(s, report.WriterOptions{Resync: 3 * time.Second, Clock: clk})
	ctx := run(t, w)
	_ = w.Report(ctx, health.Snapshot{})
	for i := range 3 {
		if d := clk.nextTimer(t); d != 3*time.Second {
			t.Fatalf("after sync %d the Writer waits %v, want the resync period (3s)", i+1, d)
		}
		if n := len(s.snapshot()); n != i+1 {
			t.Fatalf("%d syncs after %d resync periods without any report, want %d", n, i, i+1)
		}
		clk.Step(3 * time.Second)
	}
}

// gatedSyncer blocks each Sync until the test releases it, and fails when told to.
type gatedSyncer struct {
	started chan struct{}
	release chan error
}

func (s *gatedSyncer) Name() string { return "gated" }

func (s *gatedSyncer) Sync(context.Context, health.Snapshot) (int, error) {
	s.started <- struct{}{}
	return 1, <-s.release
}

func TestWriterWaitSettled(t *testing.T) {
	s := &gatedSyncer{started: make(chan struct{}), release: make(chan error)}
	w := report.NewWriter(s, report.WriterOptions{Resync: time.Hour, BaseDelay: time.Hour, Clock: newTimerClock()})
	ctx := run(t, w)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	_ = w.Report(ctx, health.Snapshot{})
	first := w.Reported()
	<-s.started
	if w.WaitSettled(cancelled, first) {
		t.Fatal("WaitSettled: settled while the Sync of that report is still running")
	}
	s.release <- nil
	if !w.WaitSettled(ctx, first) {
		t.Fatal("WaitSettled: not settled after the Sync finished")
	}

	// A failed Sync settles its report too: the sinks waiting on it must not wait for the retry.
	_ = w.Report(ctx, health.Snapshot{})
	second := w.Reported()
	if second != first+1 {
		t.Fatalf("Reported() = %d after two reports, want %d", second, first+1)
	}
	if w.WaitSettled(cancelled, second) {
		t.Fatal("WaitSettled: a new report counted as settled before its Sync")
	}
	<-s.started
	s.release <- errors.New("conflict")
	if !w.WaitSettled(ctx, second) {
		t.Fatal("WaitSettled: not settled after a failed Sync")
	}
	if !w.WaitSettled(cancelled, first) {
		t.Error("WaitSettled: an older report is not settled once a later one is")
	}
}

// pacedSyncer is a countingSyncer with a write of its own due 2s after now (a heartbeat).
type pacedSyncer struct {
	countingSyncer
	clk clock.PassiveClock
}

func (s *pacedSyncer) NextSync() time.Time { return s.clk.Now().Add(2 * time.Second) }

// TestWriterSyncsWhenAPacerIsDue: a syncer with a heartbeat due before the resync is synced by
// then; one due later waits for the resync.
func TestWriterSyncsWhenAPacerIsDue(t *testing.T) {
	for _, tc := range []struct {
		resync, want time.Duration
	}{{time.Hour, 2 * time.Second}, {time.Second, time.Second}} {
		clk := newTimerClock()
		s := &pacedSyncer{clk: clk}
		w := report.NewWriter(s, report.WriterOptions{Resync: tc.resync, Clock: clk})
		ctx := run(t, w)
		_ = w.Report(ctx, health.Snapshot{})
		if d := clk.nextTimer(t); d != tc.want {
			t.Errorf("resync %v: the Writer waits %v, want %v", tc.resync, d, tc.want)
		}
	}
}

// startingSyncer's Start blocks until ctx ends and fails then, as an informer cache does.
type startingSyncer struct{ countingSyncer }

func (s *startingSyncer) Start(ctx context.Context, _ func()) error {
	<-ctx.Done()
	return fmt.Errorf("caches did not sync: %w", ctx.Err())
}

// TestWriterStoppedWhileStartingIsNoFailure: an agent stopped while a reporter's caches still
// sync shuts down cleanly (it returned the sync's error, which failed the agent's Run).
func TestWriterStoppedWhileStartingIsNoFailure(t *testing.T) {
	w := report.NewWriter(&startingSyncer{}, report.WriterOptions{Clock: newTimerClock()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v, want nil after a stop", err)
	}
}
