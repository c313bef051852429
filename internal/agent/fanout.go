package agent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/evict"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// fanOut hands every monitor update on: to the evictor and remediation, then, with the repair
// states laid over it, to the scheduler-path writers, then to the followers (which write the
// rest once those have), and to the metrics and the log. It alone reports to the writers, so
// that they always get the latest snapshot with the latest repair states: a change of repair
// state alone (repairsChanged) reports the last snapshot again.
type fanOut struct {
	scheduling []*report.Writer
	followers  *followers
	metrics    *metrics.Metrics
	// rem and evictor are nil when remediation or eviction is off.
	rem     *remediation.Controller
	evictor *evict.Evictor

	// repairs holds one token when the repair states changed since the last report.
	repairs chan struct{}
	// latest is the last update's snapshot, before the repair states (haveLatest once there is one).
	latest     health.Snapshot
	haveLatest bool
}

// newFanOut returns a fan-out that reports to m; wire sets its writers, followers, remediation
// and evictor before it runs.
func newFanOut(m *metrics.Metrics) *fanOut {
	return &fanOut{metrics: m, repairs: make(chan struct{}, 1)}
}

// repairsChanged says remediation's states changed: the writers are to report again. It never
// blocks.
func (f *fanOut) repairsChanged() {
	select {
	case f.repairs <- struct{}{}:
	default:
	}
}

// run hands sub's updates on until ctx is done.
func (f *fanOut) run(ctx context.Context, sub *health.Subscription) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.repairs:
			f.reportRepairs(ctx)
			continue
		case <-sub.C():
		}
		if u, ok := sub.Next(); ok {
			f.update(ctx, u)
		}
	}
}

// reportRepairs reports the latest snapshot again with the repair states as they are now.
func (f *fanOut) reportRepairs(ctx context.Context) {
	if f.rem == nil || !f.haveLatest {
		return
	}
	snap := f.rem.Decorate(f.latest)
	for _, w := range f.scheduling {
		_ = w.Report(ctx, snap)
	}
	f.followers.add(health.Update{Snapshot: snap}, f.scheduling)
}

// update hands one monitor update on.
func (f *fanOut) update(ctx context.Context, u health.Update) {
	f.latest, f.haveLatest = u.Snapshot, true
	if f.evictor != nil {
		f.evictor.Update(u.Snapshot)
	}
	if f.rem != nil {
		f.rem.Update(u.Snapshot)
		u.Snapshot = f.rem.Decorate(u.Snapshot)
	}
	for _, w := range f.scheduling {
		_ = w.Report(ctx, u.Snapshot)
	}
	f.followers.add(u, f.scheduling)
	logger := klog.FromContext(ctx)
	if u.Dropped > 0 {
		logger.Info("Fell behind; some transitions were not recorded as events", "dropped", u.Dropped)
	}
	f.metrics.Transitions(u.Transitions)
	for _, t := range u.Transitions {
		logger.Info("GPU health changed", "gpu", t.Device.UUID, "index", t.Device.Index, "from", t.From, "to", t.To, "reason", t.Reason)
	}
}
