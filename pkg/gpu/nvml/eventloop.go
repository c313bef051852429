package nvml

import (
	"context"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// loop waits for events until ctx ends. A timeout is the normal idle case. Any other failure
// is counted, logged and retried after an exponential backoff; it never marks a GPU by itself.
// After ERROR_UNKNOWN the set is freed and a new one made after the backoff, as nvml.h asks of
// a set that failed so at registration; after ERROR_GPU_IS_LOST every GPU is probed, and when
// a registered one is lost the set is made anew without it (NVML cannot take one GPU off a
// set), so that the set does not keep failing. When Wait says the driver went away the loop
// ends with a *DriverGoneError (driveraway.go).
func (w *watcher) loop(ctx context.Context) error {
	timeoutMs := uint32(min(w.b.opts.eventWait.Milliseconds(), int64(^uint32(0))))
	for ctx.Err() == nil {
		if !w.enter(ctx) {
			return nil
		}
		retry := w.step(ctx, timeoutMs)
		w.b.gate.leave()
		if w.gone != nil {
			return w.b.driverWentAway(w.gone, w.sink)
		}
		if retry && !w.sleep(ctx, w.backoff) {
			return nil
		}
	}
	return nil
}

// step waits once for an event, or makes a set when there is none, and handles the answer. It
// reports whether to back off before the next step. The caller has entered the gate.
func (w *watcher) step(ctx context.Context, timeoutMs uint32) bool {
	if w.set == nil {
		return !w.rebuild()
	}
	// The loop's progress is timed through the event's handling too: a loop stuck handing an
	// event on (a blocked sink) stops the agent seeing anything, as a hung Wait does.
	w.b.waiting.begin(w.b.opts.clock.Now())
	defer w.b.waiting.end()
	data, ret := w.set.Wait(timeoutMs)
	switch ret {
	case nvml.SUCCESS:
		w.resetBackoff()
		w.b.stats.add(func(s *Stats) { s.Events++ })
		w.b.handleEvent(data, w.sink)
		return false
	case nvml.ERROR_TIMEOUT:
		w.resetBackoff()
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	if driverGone(ret) {
		w.gone = &DriverGoneError{Op: "waiting for NVML events", Ret: ret, At: w.b.opts.clock.Now()}
		return false
	}
	w.failed(nvmlError("waiting for NVML events", ret))
	if w.dropAfter(ret) {
		w.free()
	}
	return true
}

// enter waits until the event loop may call NVML and enters the gate. While a reset wants NVML
// it frees the event set (the reset waits for that) and waits; once NVML was initialised again
// it makes the set anew through start, with its retries, since the old set and handles died
// with the old session. It returns false when ctx ended, or when events turned out not to be
// supported after a reset (start then marked every GPU unmonitored for events).
func (w *watcher) enter(ctx context.Context) bool {
	for ctx.Err() == nil {
		epoch, wake, ok := w.b.gate.tryEnter()
		if !ok {
			w.free()
			if !w.b.gate.park(ctx, wake) {
				return false
			}
			continue
		}
		if epoch == w.epoch {
			return true
		}
		w.b.gate.leave()
		w.b.log.Info("NVML initialised again after a GPU reset: making the event set anew")
		if err := w.start(ctx); err != nil {
			// The loop keeps trying (rebuild) with backoff: Run does not end after a reset.
			w.b.log.Error(err, "making the event set anew after a GPU reset failed: retrying")
		}
		if w.unsupported {
			return false
		}
	}
	return false
}

// dropAfter reports whether the set is to be replaced after Wait answered ret.
func (w *watcher) dropAfter(ret nvml.Return) bool {
	switch {
	case ret == nvml.ERROR_UNKNOWN:
		return true
	case isFault(ret):
		// Wait does not say which GPU; find the ones that are broken.
		w.b.probeLost(w.sink)
		return slices.ContainsFunc(w.registered, func(g *gpu) bool { return g.lost.Load() })
	}
	return false
}

// rebuild makes a new event set with every GPU that is not lost on it. It reports whether it
// made one; when not, the failure is counted like a Wait failure.
func (w *watcher) rebuild() bool {
	ret, _ := w.open(true)
	if driverGone(ret) {
		w.gone = &DriverGoneError{Op: "creating the NVML event set again", Ret: ret, At: w.b.opts.clock.Now()}
		return false
	}
	if ret != nvml.SUCCESS {
		w.failed(nvmlError("creating the NVML event set again", ret))
		return false
	}
	w.b.stats.add(func(s *Stats) { s.EventSetRebuilds++ })
	w.b.log.Info("NVML event set made anew", "gpus", len(w.registered))
	return true
}

// failed counts a failure and doubles the backoff.
func (w *watcher) failed(err error) {
	w.backoff = min(max(2*w.backoff, w.b.opts.backoffInitial), w.b.opts.backoffMax)
	backoff := w.backoff
	w.b.stats.add(func(s *Stats) {
		s.WaitErrors++
		s.ConsecutiveWaitErrors++
		s.Backoff = backoff
		s.LastWaitError = err.Error()
	})
	w.b.log.Error(err, "retrying", "backoff", backoff)
}

func (w *watcher) resetBackoff() {
	if w.backoff == 0 {
		return
	}
	w.backoff = 0
	w.b.stats.add(func(s *Stats) { s.ConsecutiveWaitErrors, s.Backoff = 0, 0 })
}
