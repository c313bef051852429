package agent

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// stepSyncer records the order of everything that happened, and blocks each Sync until released
// when gated.
type stepSyncer struct {
	name    string
	log     *stepLog
	release chan struct{} // nil: never blocks
	fail    bool          // every Sync fails (the step is still logged)
}

func (s *stepSyncer) Name() string { return s.name }

func (s *stepSyncer) Sync(_ context.Context, snap health.Snapshot) (int, error) {
	if s.release != nil {
		<-s.release
	}
	s.log.add(s.name + " " + snap.Time.Format("05"))
	if s.fail {
		return 0, errors.New("the API server refused it")
	}
	return 1, nil
}

type stepLog struct {
	mu    sync.Mutex
	steps []string
	added chan struct{}
}

func (l *stepLog) add(step string) {
	l.mu.Lock()
	l.steps = append(l.steps, step)
	l.mu.Unlock()
	l.added <- struct{}{}
}

func (l *stepLog) Record(t health.Transition) { l.add("event " + t.Device.UUID) }

// wait returns the log once it has n steps.
func (l *stepLog) wait(t *testing.T, n int) []string {
	t.Helper()
	for {
		l.mu.Lock()
		got := slices.Clone(l.steps)
		l.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-l.added:
		case <-time.After(30 * time.Second): // only reached when a step never happens
			t.Fatalf("steps so far: %v, want %d", got, n)
		}
	}
}

func TestFollowersWriteAfterTheSchedulerPathAndCoalesce(t *testing.T) {
	log := &stepLog{added: make(chan struct{}, 100)}
	gate := make(chan struct{})
	annotation := report.NewWriter(&stepSyncer{name: "annotation", log: log, release: gate}, report.WriterOptions{Resync: time.Hour})
	condition := report.NewWriter(&stepSyncer{name: "condition", log: log}, report.WriterOptions{Resync: time.Hour})
	scheduling, following := splitBySchedulerPath([]*report.Writer{condition, annotation})
	if len(scheduling) != 1 || scheduling[0] != annotation || len(following) != 1 || following[0] != condition {
		t.Fatalf("split: scheduling %d writers, following %d; want the annotation first and the condition after", len(scheduling), len(following))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = condition.Run(ctx) }()
	f := newFollowers(following, log)

	// Two updates before the annotation writes anything: the condition and the Events must wait
	// for it, then see both transitions in order and only the latest snapshot. The followers and
	// the annotation's writer start after both, so that both updates are pending when they do:
	// followers started earlier could take the first update alone before the second arrives (seen
	// in CI: event GPU-a, condition 01, then GPU-b), and an annotation writer started earlier
	// could take 01 and then block on the gate for 02 until the hold ran out.
	for i, gpu := range []string{"GPU-a", "GPU-b"} {
		u := health.Update{Snapshot: health.Snapshot{Time: time.Unix(int64(i+1), 0)}, Transitions: []health.Transition{{Device: health.Device{UUID: gpu}}}}
		_ = annotation.Report(ctx, u.Snapshot)
		f.add(u, scheduling)
	}
	go func() { _ = f.run(ctx, scheduling) }()
	go func() { _ = annotation.Run(ctx) }()
	gate <- struct{}{} // the annotation syncs the latest snapshot (02)
	got := log.wait(t, 4)
	want := []string{"annotation 02", "event GPU-a", "event GPU-b", "condition 02"}
	if !slices.Equal(got, want) {
		t.Errorf("steps %v, want %v", got, want)
	}
}

func TestFollowersDoNotWaitForeverOnTheSchedulerPath(t *testing.T) {
	log := &stepLog{added: make(chan struct{}, 100)}
	never := make(chan struct{})
	defer close(never)
	stuck := report.NewWriter(&stepSyncer{name: "annotation", log: log, release: never}, report.WriterOptions{Resync: time.Hour})
	condition := report.NewWriter(&stepSyncer{name: "condition", log: log}, report.WriterOptions{Resync: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, w := range []*report.Writer{stuck, condition} {
		go func() { _ = w.Run(ctx) }()
	}
	f := newFollowers([]*report.Writer{condition}, log)
	f.hold = 100 * time.Millisecond
	go func() { _ = f.run(ctx, []*report.Writer{stuck}) }()
	u := health.Update{Snapshot: health.Snapshot{Time: time.Unix(3, 0)}}
	_ = stuck.Report(ctx, u.Snapshot)
	f.add(u, []*report.Writer{stuck})
	// The annotation's Sync never finishes; after followHold the condition is written anyway.
	if got := log.wait(t, 1); got[0] != "condition 03" {
		t.Errorf("steps %v, want the condition written after the hold", got)
	}
}

// TestFollowersDoNotWaitForAFailingSchedulerPath: the annotation's Sync fails; the condition is
// written once it has failed, long before the hold (an hour here) would let it.
func TestFollowersDoNotWaitForAFailingSchedulerPath(t *testing.T) {
	log := &stepLog{added: make(chan struct{}, 100)}
	failing := report.NewWriter(&stepSyncer{name: "annotation", log: log, fail: true}, report.WriterOptions{Resync: time.Hour, BaseDelay: time.Hour})
	condition := report.NewWriter(&stepSyncer{name: "condition", log: log}, report.WriterOptions{Resync: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, w := range []*report.Writer{failing, condition} {
		go func() { _ = w.Run(ctx) }()
	}
	f := newFollowers([]*report.Writer{condition}, log)
	f.hold = time.Hour
	go func() { _ = f.run(ctx, []*report.Writer{failing}) }()
	u := health.Update{Snapshot: health.Snapshot{Time: time.Unix(4, 0)}}
	_ = failing.Report(ctx, u.Snapshot)
	f.add(u, []*report.Writer{failing})
	if got := log.wait(t, 2); !slices.Equal(got, []string{"annotation 04", "condition 04"}) {
		t.Errorf("steps %v, want the failed annotation, then the condition", got)
	}
}
