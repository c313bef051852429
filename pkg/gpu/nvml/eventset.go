package nvml

import (
	"context"
	"math/bits"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// watcher owns the event sets of one Run: it creates one (trying again at start, when the node
// may still be initialising), registers the GPUs on it type by type, waits on it, and replaces
// it when it can no longer be used. Only the event loop's goroutine touches it.
type watcher struct {
	b    *Backend
	sink gpuapi.Sink
	// set is nil while there is none; registered lists the GPUs registered on it.
	set        nvml.EventSet
	registered []*gpu
	backoff    time.Duration
	// epoch is the gate's epoch when the set was made: the NVML session it belongs to.
	// unsupported is set when start found events not supported: nothing is watched.
	epoch       uint64
	unsupported bool
	// gone is set when NVML answered that the driver went away: the loop ends with it.
	gone *DriverGoneError
}

// watchEvents runs the event loop until ctx ends and frees the event set before it returns. It
// returns an error only when no event set can be created at start.
func (b *Backend) watchEvents(ctx context.Context, sink gpuapi.Sink) error {
	w := &watcher{b: b, sink: sink}
	defer w.free()
	err := w.start(ctx)
	if w.gone != nil {
		return b.driverWentAway(w.gone, sink)
	}
	if err != nil || w.set == nil {
		return err
	}
	return w.loop(ctx)
}

// createEventSet creates an event set, unless the driver lacks the event functions: then it
// answers FUNCTION_NOT_FOUND without calling any of them.
func (b *Backend) createEventSet() (nvml.EventSet, nvml.Return) {
	if b.eventsOff != "" {
		return nil, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return b.lib.EventSetCreate()
}

// start creates the event set and registers every GPU on it. When NVML fails in a way that may
// pass (creating the set, or registering a GPU, fails with anything but NOT_SUPPORTED or a
// broken GPU), it frees what it made and tries again after a backoff, startAttempts times in
// all; then it keeps what the last try made, or returns an error if that made no set. A system
// without events (NOT_SUPPORTED) leaves every GPU unmonitored for events, and no set.
func (w *watcher) start(ctx context.Context) error {
	delay := w.b.opts.startBackoff
	for attempt := 1; ; attempt++ {
		last := attempt >= w.b.opts.startAttempts
		epoch, ok := w.b.gate.enter(ctx)
		if !ok {
			return nil
		}
		w.epoch = epoch
		ret, failed := w.open(last)
		switch {
		case driverGone(ret):
			w.b.gate.leave()
			w.gone = &DriverGoneError{Op: "creating the NVML event set", Ret: ret, At: w.b.opts.clock.Now()}
			return nil
		case notSupported(ret):
			w.b.gate.leave()
			w.b.log.Info("NVML events are not supported: every GPU is unmonitored for events", "error", ret.Error())
			for _, g := range w.b.gpus {
				w.b.setUnmonitored(g, w.sink, true)
			}
			w.unsupported = true
			return nil
		case ret == nvml.SUCCESS && (failed == 0 || last):
			w.b.gate.leave()
			return nil
		case ret != nvml.SUCCESS && last:
			w.b.gate.leave()
			return nvmlError("creating the NVML event set", ret)
		}
		w.free()
		w.b.gate.leave()
		log := w.b.log.WithValues("attempt", attempt, "of", w.b.opts.startAttempts, "backoff", delay)
		if ret != nvml.SUCCESS {
			log.Info("creating the NVML event set failed: trying again", "error", ret.Error())
		} else {
			log.Info("registering events failed on some GPUs: trying again", "failedGPUs", failed)
		}
		if !w.sleep(ctx, delay) {
			return nil
		}
		delay = min(2*delay, max(w.b.opts.backoffMax, w.b.opts.startBackoff))
	}
}

// open creates a new event set and registers on it every GPU that is not lost. nvml.h: after
// ERROR_UNKNOWN from nvmlDeviceRegisterEvents "event set is in undefined state and should be
// freed"; so it is freed, and a new one made without that GPU. It returns the creation's answer
// and how many GPUs failed to register in a way that may pass; when final, those are marked
// unmonitored for events.
func (w *watcher) open(final bool) (nvml.Return, int) {
	skip := map[*gpu]bool{}
	failed := 0
	for {
		set, ret := w.b.createEventSet()
		if ret != nvml.SUCCESS {
			return ret, failed
		}
		w.b.gate.setMade()
		w.set, w.registered = set, nil
		broke, n := w.registerAll(skip, final)
		failed += n
		if broke == nil {
			return nvml.SUCCESS, failed
		}
		w.free()
		skip[broke] = true
	}
}

// registerAll registers every GPU not in skip and not lost on w.set. It stops at a GPU whose
// registration left the set undefined (ERROR_UNKNOWN) and returns it, with how many GPUs failed
// in a way that may pass.
func (w *watcher) registerAll(skip map[*gpu]bool, final bool) (broke *gpu, failed int) {
	for _, g := range w.b.gpus {
		if skip[g] || g.lost.Load() {
			continue
		}
		mask, ret := w.b.registerGPU(w.set, g)
		log := w.b.log.WithValues("gpu", g.dev.UUID)
		switch {
		case ret == nvml.SUCCESS && mask != 0:
			log.V(1).Info("watching events", "events", EventNames(mask))
			w.registered = append(w.registered, g)
			w.b.setUnmonitored(g, w.sink, false)
		case ret == nvml.SUCCESS, notSupported(ret):
			log.Info("GPU events are not supported: the GPU is unmonitored for events")
			w.b.setUnmonitored(g, w.sink, true)
		case isFault(ret):
			kind, _ := faultOf(ret)
			log.Info("GPU is broken", "error", ret.Error(), "signal", kind)
			w.b.reportBroken(g, kind, w.b.opts.clock.Now(), w.sink)
		default:
			failed++
			w.registrationFailed(g, ret, final)
			if ret == nvml.ERROR_UNKNOWN {
				return g, failed
			}
		}
	}
	return nil, failed
}

// registrationFailed reports a registration that failed in a way that may pass: on the final
// try, the GPU is unmonitored for events.
func (w *watcher) registrationFailed(g *gpu, ret nvml.Return, final bool) {
	err := nvmlError("registering events", ret)
	if !final {
		w.b.log.Info("registering events failed: trying again", "gpu", g.dev.UUID, "error", err.Error())
		return
	}
	w.b.log.Error(err, "GPU is unmonitored for events", "gpu", g.dev.UUID)
	w.b.setUnmonitored(g, w.sink, true)
}

// registerGPU registers g's watched events on set. nvml.h: NOT_SUPPORTED answers a mask with
// any type the GPU does not support, and then "none of the requested eventTypes are
// registered"; the set can still be used. So the types are then registered one by one, and the
// GPU keeps every type it takes (ECC and retirement events too, not only XIDs). It returns the
// types registered and the first answer other than SUCCESS and NOT_SUPPORTED (else SUCCESS).
func (b *Backend) registerGPU(set nvml.EventSet, g *gpu) (uint64, nvml.Return) {
	mask, ret := b.supportedEvents(g)
	if ret != nvml.SUCCESS || mask == 0 {
		return 0, ret
	}
	switch ret = g.handle.RegisterEvents(mask, set); {
	case ret == nvml.SUCCESS:
		return mask, ret
	case !notSupported(ret) || bits.OnesCount64(mask) == 1:
		return 0, ret
	}
	return b.registerEach(set, g, mask)
}

// registerEach registers the types of mask one by one, keeping those the GPU takes.
func (b *Backend) registerEach(set nvml.EventSet, g *gpu, mask uint64) (uint64, nvml.Return) {
	var got, refused uint64
	for _, e := range eventNames {
		if mask&e.bit == 0 {
			continue
		}
		switch ret := g.handle.RegisterEvents(e.bit, set); {
		case ret == nvml.SUCCESS:
			got |= e.bit
		case notSupported(ret):
			refused |= e.bit
		default:
			return got, ret
		}
	}
	b.log.Info("GPU refuses some event types it lists as supported: watching the others", "gpu", g.dev.UUID,
		"refused", EventNames(refused), "events", EventNames(got))
	return got, nvml.SUCCESS
}

// free frees the event set, if there is one.
func (w *watcher) free() {
	if w.set == nil {
		return
	}
	if ret := w.set.Free(); ret != nvml.SUCCESS {
		w.b.log.Error(nvmlError("freeing the event set", ret), "leaking the NVML event set")
	}
	w.set, w.registered = nil, nil
	w.b.gate.setFreed()
}

// sleep waits d on the backend's clock; it returns false when ctx ended first. It ends early
// when a reset wants NVML, so that the event set it may hold is freed without delay (the
// caller then enters the gate, which frees it and waits).
func (w *watcher) sleep(ctx context.Context, d time.Duration) bool {
	timer := w.b.opts.clock.NewTimer(d)
	defer timer.Stop()
	for {
		wake, wanted := w.b.gate.wake()
		if wanted {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-timer.C():
			return true
		case <-wake:
		}
	}
}
