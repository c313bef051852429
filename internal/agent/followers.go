package agent

import (
	"context"
	"sync"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// followHold bounds how long the following sinks wait for the scheduler path. A Sync that fails
// settles when its request fails, so a failing API server holds them back no longer than that;
// the hold bites while the scheduler path's requests are in flight or waiting in the client's
// rate limiter, or while the agent's own Node watch lags behind its write (delivered). It is long because a busy API server answers
// slowly for good reason: in a wave across 5,000 nodes the taints take about ten seconds to be
// answered, and the 2 s hold this once was let the conditions and Events (half the wave's
// requests) compete with the taints still queued, 1.26× a bare client's time to the last taint.
const followHold = 30 * time.Second

// schedulerPath names the reporters whose objects schedulers read when they place a pod: the
// Volcano and HAMi annotations and the DRA taints. A GPU state change writes them first.
var schedulerPath = map[string]bool{config.ReporterAnnotation: true, config.ReporterDeviceTaint: true, config.ReporterHAMi: true}

// splitBySchedulerPath splits the writers into those schedulers read and the rest, in order.
func splitBySchedulerPath(writers []*report.Writer) (scheduling, following []*report.Writer) {
	for _, w := range writers {
		if schedulerPath[w.Name()] {
			scheduling = append(scheduling, w)
		} else {
			following = append(following, w)
		}
	}
	return scheduling, following
}

// eventRecorder records one Node Event per transition.
type eventRecorder interface {
	Record(health.Transition)
}

// followers writes what schedulers do not read (the Node condition, the claims' device status,
// Node Events) once the scheduler-path writers have finished writing the same update. On a busy
// API server, requests sent together slow each other down: measured on the local control plane,
// the condition's and the Event's requests, sent beside the annotation's and the rule's, made
// those about 1.3× slower (docs/benchmarks.md). Updates that arrive while it waits coalesce: every
// transition still gets its Event, in order, and the writers get the latest snapshot.
type followers struct {
	writers []*report.Writer
	events  eventRecorder
	// delivered, when set, waits until the scheduler path's Node writes have reached watchers
	// (the agent's own Node informer has them), within the same hold.
	delivered func(context.Context)
	// hold is followHold, shorter in tests.
	hold time.Duration

	mu          sync.Mutex
	pending     bool
	snapshot    health.Snapshot
	transitions []health.Transition
	// reports holds, per scheduler-path writer, the report number to wait for.
	reports []uint64
	wake    chan struct{}
}

func newFollowers(writers []*report.Writer, events eventRecorder) *followers {
	return &followers{writers: writers, events: events, hold: followHold, wake: make(chan struct{}, 1)}
}

// add queues u, which has just been reported to the scheduler-path writers.
func (f *followers) add(u health.Update, scheduling []*report.Writer) {
	f.mu.Lock()
	f.pending = true
	f.snapshot = u.Snapshot
	f.transitions = append(f.transitions, u.Transitions...)
	f.reports = f.reports[:0]
	for _, w := range scheduling {
		f.reports = append(f.reports, w.Reported())
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// take returns and clears what is pending.
func (f *followers) take() (snap health.Snapshot, transitions []health.Transition, reports []uint64, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pending {
		return health.Snapshot{}, nil, nil, false
	}
	snap, transitions, reports = f.snapshot, f.transitions, append([]uint64(nil), f.reports...)
	f.pending, f.transitions = false, nil
	return snap, transitions, reports, true
}

// run hands each pending update on, once scheduling has settled it or followHold has passed,
// until ctx ends.
func (f *followers) run(ctx context.Context, scheduling []*report.Writer) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.wake:
		}
		snap, transitions, reports, ok := f.take()
		if !ok {
			continue
		}
		hold, cancel := context.WithTimeout(ctx, f.hold)
		for i, w := range scheduling {
			w.WaitSettled(hold, reports[i])
		}
		if f.delivered != nil {
			f.delivered(hold)
		}
		cancel()
		for _, t := range transitions {
			f.events.Record(t)
		}
		for _, w := range f.writers {
			_ = w.Report(ctx, snap)
		}
	}
}
