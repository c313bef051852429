package breaker

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// defaultInterval is the longest between two rounds of the breaker controller's loops.
const defaultInterval = 10 * time.Second

// runRounds is the loop of the breaker controller's sweepers (Sweeper, DomainWatcher): it runs
// round until ctx is done, first at once, then after interval (default 10s), or sooner when a
// round returns the time its next work is due (zero: none). A round's error is logged, with
// ctx's logger, as failed says and retried at the next round. clk nil is the real clock.
func runRounds(ctx context.Context, clk clock.Clock, interval time.Duration, failed string,
	round func(now time.Time) (next time.Time, err error)) error {
	logger := klog.FromContext(ctx)
	if clk == nil {
		clk = clock.RealClock{}
	}
	if interval <= 0 {
		interval = defaultInterval
	}
	for {
		next, err := round(clk.Now())
		if err != nil && ctx.Err() == nil {
			logger.Error(err, failed)
		}
		wait := interval
		if !next.IsZero() {
			// A second after the work is due: the agents compare with their own clocks, and a
			// second of slack keeps the round from running just before.
			wait = min(interval, max(next.Sub(clk.Now())+time.Second, time.Second))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(wait):
		}
	}
}
