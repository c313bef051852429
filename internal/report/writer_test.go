package report_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
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

type observer struct {
	mu             sync.Mutex
	writes, errors int
}

func (o *observer) ObserveSync(_ string, writes int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.writes += writes
	if err != nil {
		o.errors++
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWriterCoalescesToTheLatestSnapshot(t *testing.T) {
	s := &countingSyncer{}
	w := report.NewWriter(s, report.WriterOptions{Resync: time.Hour})
	// Reports before Run starts pile up; the worker must sync only the last one.
	for i := range 1000 {
		_ = w.Report(context.Background(), health.Snapshot{Time: time.Unix(int64(i), 0)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx) }()
	waitFor(t, "a sync", func() bool { return len(s.snapshot()) > 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
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
	w := report.NewWriter(s, report.WriterOptions{Resync: time.Hour, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond, Observer: o})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	_ = w.Report(ctx, health.Snapshot{})
	waitFor(t, "a successful sync after three failures", w.Synced)
	if n := len(s.snapshot()); n != 4 {
		t.Errorf("%d sync attempts, want 4 (3 failures, then success)", n)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.errors != 3 || o.writes != 1 {
		t.Errorf("observed %d errors and %d writes, want 3 and 1", o.errors, o.writes)
	}
}

func TestWriterResyncsPeriodically(t *testing.T) {
	s := &countingSyncer{}
	w := report.NewWriter(s, report.WriterOptions{Resync: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.Run(ctx) }()
	_ = w.Report(ctx, health.Snapshot{})
	waitFor(t, "three resyncs without any report", func() bool { return len(s.snapshot()) >= 3 })
}

func TestUnhealthyIndexesAndSummaries(t *testing.T) {
	t0 := time.Unix(100, 0).UTC()
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-3", Index: 3}, Health: health.Unhealthy, Conditions: []health.Condition{
			{Type: health.ConditionThermal, Severity: health.Degraded, Reason: "TemperatureAtSlowdown", Since: t0},
			{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Since: t0.Add(time.Second)},
		}},
		{Device: health.Device{UUID: "GPU-0", Index: 0}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "MIG-1", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-1"}}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "GPU-1", Index: 1}, Health: health.Degraded},
	}}
	got := gpuhealthv1.UnhealthyIndexes(snap)
	if len(got) != 2 || got[0] != 0 || got[1] != 3 {
		t.Errorf("UnhealthyIndexes = %v, want [0 3] (MIG instances do not count on their own)", got)
	}
	s := gpuhealthv1.Summarize(snap.Devices[0])
	if len(s.Reasons) != 2 || s.Reasons[0] != "XID79" || s.Since == nil || !s.Since.Equal(t0.Add(time.Second)) {
		t.Errorf("Summarize = %+v, want the worst reason first and its since", s)
	}
}

func TestSummaryListsWhatIsUnmonitored(t *testing.T) {
	d := health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, Unmonitored: true,
		UnmonitoredChecks: []health.Check{health.CheckECC, health.CheckRowRemap}}
	if got := gpuhealthv1.Summarize(d).Unmonitored; !slices.Equal(got, []string{"events", "ecc", "rowRemap"}) {
		t.Errorf("Unmonitored = %v", got)
	}
	if got := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-b"}}).Unmonitored; got != nil {
		t.Errorf("a fully watched GPU lists %v", got)
	}
}
