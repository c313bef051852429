package nvml

import (
	"fmt"
	"sync/atomic"
	"time"
)

// inFlight records since when a call into NVML has been running (zero: none is).
type inFlight struct{ since atomic.Int64 }

func (f *inFlight) begin(now time.Time) { f.since.Store(now.UnixNano()) }
func (f *inFlight) end()                { f.since.Store(0) }

// running reports how long the call in flight has been running at now, and whether there is one.
func (f *inFlight) running(now time.Time) (time.Duration, bool) {
	since := f.since.Load()
	if since == 0 {
		return 0, false
	}
	return now.Sub(time.Unix(0, since)), true
}

// stallMargin is added to the longest a call may take before it counts as hung: a loaded node
// may be slow, and a false alarm restarts the agent.
const stallMargin = 30 * time.Second

// Stalled reports a loop that stopped making progress, most often a call into NVML that hangs (a
// wedged GPU or driver: NVML calls have no timeout of their own, and the goroutine cannot be
// taken back): a sampling round (its reads and the signals it hands on) running longer than
// three sample periods, or an EventSet.Wait and the handling of its event longer than three times
// the wait's own timeout, each plus a margin. The agent's /healthz fails then, and the kubelet restarts the agent, which opens
// NVML afresh; until then the GPUs' readings are as old as the stall. A reset in progress parks
// the loops outside NVML, so it does not count.
func (b *Backend) Stalled(now time.Time) error {
	if d, ok := b.sampling.running(now); ok && d > 3*b.opts.samplePeriod+stallMargin {
		return fmt.Errorf("a sampling round has been in NVML for %v (a hung call)", d.Round(time.Second))
	}
	if d, ok := b.waiting.running(now); ok && d > 3*b.opts.eventWait+stallMargin {
		return fmt.Errorf("waiting for NVML events has taken %v, more than three times its %v timeout (a hung call)", d.Round(time.Second), b.opts.eventWait)
	}
	return nil
}
