package nvml

import (
	"context"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sync/errgroup"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// WatchedEvents is every event type the backend registers for, where the GPU supports it.
const WatchedEvents uint64 = nvml.EventTypeXidCriticalError |
	nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError |
	nvml.EventTypeSingleBitEccErrorStorm |
	nvml.EventTypeDramRetirementEvent |
	nvml.EventTypeDramRetirementFailure |
	nvml.EventTypeGpuUnavailableError |
	nvml.EventTypeGpuRecoveryAction

// XIDRecoveryActionChanged is the XID that tells to read NVML's GPU recovery action.
const XIDRecoveryActionChanged = 154

var eventNames = []struct {
	bit  uint64
	name string
}{
	{nvml.EventTypeXidCriticalError, "xid"},
	{nvml.EventTypeDoubleBitEccError, "doubleBitECC"},
	{nvml.EventTypeSingleBitEccError, "singleBitECC"},
	{nvml.EventTypeSingleBitEccErrorStorm, "singleBitECCStorm"},
	{nvml.EventTypeDramRetirementEvent, "dramRetirement"},
	{nvml.EventTypeDramRetirementFailure, "dramRetirementFailure"},
	{nvml.EventTypeGpuUnavailableError, "gpuUnavailable"},
	{nvml.EventTypeGpuRecoveryAction, "gpuRecoveryAction"},
}

// EventNames names the watched event types set in mask, in a fixed order.
func EventNames(mask uint64) []string {
	var names []string
	for _, e := range eventNames {
		if mask&e.bit != 0 {
			names = append(names, e.name)
		}
	}
	return names
}

// Run watches the GPUs until ctx ends: the event loop and the sampler, each in a goroutine that
// Run owns and waits for. It returns nil when ctx ends and an error only when watching cannot
// start (the event set cannot be created). The event set is freed before Run returns. Run may be
// called once at a time.
func (b *Backend) Run(ctx context.Context, sink Sink) error {
	b.announce(sink)
	set, ret := b.createEventSet()
	switch {
	case ret == nvml.SUCCESS:
	case notSupported(ret):
		// No events at all on this system: sample only, and say so.
		b.log.Info("NVML events are not supported: every GPU is unmonitored for events")
		for _, g := range b.gpus {
			b.setUnmonitored(g, sink, true)
		}
		set = nil
	default:
		return nvmlError("creating the NVML event set", ret)
	}
	g, ctx := errgroup.WithContext(ctx)
	if set != nil {
		g.Go(func() error {
			defer func() {
				if ret := set.Free(); ret != nvml.SUCCESS {
					b.log.Error(nvmlError("freeing the event set", ret), "leaking the NVML event set")
				}
			}()
			b.register(set, sink)
			return b.eventLoop(ctx, set, sink)
		})
	}
	g.Go(func() error { return b.sampleLoop(ctx, sink) })
	return g.Wait()
}

// createEventSet creates the event set, unless the driver lacks the event functions: then it
// answers FUNCTION_NOT_FOUND without calling any of them.
func (b *Backend) createEventSet() (nvml.EventSet, nvml.Return) {
	if b.eventsOff != "" {
		return nil, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	return b.lib.EventSetCreate()
}

// supportedEvents returns the watched event types a GPU supports, as Run registers them: not
// the ECC events when ECC is off, as they never come.
func (b *Backend) supportedEvents(g *gpu) (uint64, nvml.Return) {
	if b.eventsOff != "" {
		return 0, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	mask, ret := g.handle.GetSupportedEventTypes()
	mask &= WatchedEvents
	if g.eccDisabled {
		mask &^= eccEvents
	}
	return mask, ret
}

// register registers every GPU's watched events on set. A GPU that supports none of them, or
// refuses registration with NOT_SUPPORTED, is unmonitored: visible, not unhealthy.
func (b *Backend) register(set nvml.EventSet, sink Sink) {
	for _, g := range b.gpus {
		log := b.log.WithValues("gpu", g.dev.UUID)
		mask, ret := b.supportedEvents(g)
		if ret == nvml.SUCCESS && mask != 0 {
			ret = g.handle.RegisterEvents(mask, set)
			if notSupported(ret) && mask&nvml.EventTypeXidCriticalError != 0 && mask != nvml.EventTypeXidCriticalError {
				// Some GPUs refuse a mask they claim to support; XIDs alone still tell most.
				log.Info("registering all supported events failed, retrying with XID events only", "events", EventNames(mask), "error", ret.Error())
				mask = nvml.EventTypeXidCriticalError
				ret = g.handle.RegisterEvents(mask, set)
			}
		}
		switch {
		case ret == nvml.SUCCESS && mask != 0:
			log.V(1).Info("watching events", "events", EventNames(mask))
			b.setUnmonitored(g, sink, false)
		case ret == nvml.SUCCESS, notSupported(ret):
			log.Info("GPU events are not supported: the GPU is unmonitored for events")
			b.setUnmonitored(g, sink, true)
		case isFault(ret):
			kind, _ := faultOf(ret)
			log.Info("GPU is broken", "error", ret.Error(), "signal", kind)
			sink.Signal(health.Signal{Kind: kind, Device: g.dev.UUID, Time: b.opts.clock.Now()})
		default:
			log.Error(nvmlError("registering events", ret), "GPU is unmonitored for events")
			b.setUnmonitored(g, sink, true)
		}
	}
}

func (b *Backend) setUnmonitored(g *gpu, sink Sink, unmonitored bool) {
	sink.SetUnmonitored(g.dev.UUID, unmonitored)
	for _, m := range g.migs {
		sink.SetUnmonitored(m.UUID, unmonitored)
	}
}

// eventLoop waits for events until ctx ends. A timeout is the normal idle case. Any other Wait
// failure is counted, logged and retried after an exponential backoff; it never marks a GPU.
func (b *Backend) eventLoop(ctx context.Context, set nvml.EventSet, sink Sink) error {
	timeoutMs := uint32(min(b.opts.eventWait.Milliseconds(), int64(^uint32(0))))
	var backoff time.Duration
	for {
		if ctx.Err() != nil {
			return nil
		}
		data, ret := set.Wait(timeoutMs)
		switch {
		case ret == nvml.SUCCESS:
			b.resetBackoff(&backoff)
			b.stats.add(func(s *Stats) { s.Events++ })
			b.handleEvent(data, sink)
			continue
		case ret == nvml.ERROR_TIMEOUT:
			b.resetBackoff(&backoff)
			continue
		case isFault(ret):
			// Wait does not say which GPU; find the ones that are broken.
			b.probeLost(sink)
		}
		if ctx.Err() != nil {
			return nil
		}
		backoff = min(max(2*backoff, b.opts.backoffInitial), b.opts.backoffMax)
		err := nvmlError("waiting for NVML events", ret)
		b.stats.add(func(s *Stats) {
			s.WaitErrors++
			s.ConsecutiveWaitErrors++
			s.Backoff = backoff
			s.LastWaitError = err.Error()
		})
		b.log.Error(err, "retrying", "backoff", backoff)
		timer := b.opts.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C():
		}
	}
}

func (b *Backend) resetBackoff(backoff *time.Duration) {
	if *backoff == 0 {
		return
	}
	*backoff = 0
	b.stats.add(func(s *Stats) { s.ConsecutiveWaitErrors, s.Backoff = 0, 0 })
}

// target is the GPU an event concerns and, for an event on a MIG device handle, the instance.
type target struct {
	gpu             *gpu
	scoped          bool
	gpuInstance     uint32
	computeInstance uint32
}

// attribute finds the GPU an event is about: by handle first, then by the handle's UUID, which
// may also be a MIG device's.
func (b *Backend) attribute(h nvml.Device) (target, bool) {
	if h == nil {
		return target{}, false
	}
	for _, g := range b.gpus {
		if sameHandle(g.handle, h) {
			return target{gpu: g}, true
		}
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return target{}, false
	}
	for _, g := range b.gpus {
		if g.dev.UUID == uuid {
			return target{gpu: g}, true
		}
		for _, m := range g.migs {
			if m.UUID == uuid {
				return target{gpu: g, scoped: true, gpuInstance: m.MIG.GPUInstance, computeInstance: m.MIG.ComputeInstance}, true
			}
		}
	}
	return target{}, false
}

// handleEvent turns one event into signals.
func (b *Backend) handleEvent(e nvml.EventData, sink Sink) {
	now := b.opts.clock.Now()
	t, ok := b.attribute(e.Device)
	if !ok {
		b.unattributed(e, now, sink)
		return
	}
	if e.GpuInstanceId != health.NoInstance {
		// NVML reports an instance's event on the parent GPU with the instance's IDs;
		// 0xFFFFFFFF means the whole GPU.
		t.scoped, t.gpuInstance, t.computeInstance = true, e.GpuInstanceId, e.ComputeInstanceId
	}
	b.log.V(1).Info("event", "gpu", t.gpu.dev.UUID, "type", e.EventType, "data", e.EventData,
		"gpuInstance", e.GpuInstanceId, "computeInstance", e.ComputeInstanceId)
	b.eventSignals(t, e, now, sink)
}

func (b *Backend) eventSignals(t target, e nvml.EventData, now time.Time, sink Sink) {
	g := t.gpu
	base := health.Signal{Device: g.dev.UUID, Time: now}
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		s := with(base, health.SignalXID)
		s.XID = uint32(e.EventData)
		if t.scoped {
			s.MIGScoped, s.GPUInstance, s.ComputeInstance = true, t.gpuInstance, t.computeInstance
		}
		sink.Signal(s)
		if s.XID == XIDRecoveryActionChanged {
			b.emitRecoveryAction(g, base, sink)
		}
	case nvml.EventTypeGpuRecoveryAction:
		b.emitRecoveryAction(g, base, sink)
	case nvml.EventTypeSingleBitEccError, nvml.EventTypeDoubleBitEccError:
		b.emitECCAfterEvent(g, e.EventType == nvml.EventTypeDoubleBitEccError, base, sink)
	case nvml.EventTypeSingleBitEccErrorStorm:
		sink.Signal(with(base, health.SignalECCStorm))
	case nvml.EventTypeDramRetirementEvent, nvml.EventTypeDramRetirementFailure:
		b.emitRetirementAfterEvent(g, e.EventType == nvml.EventTypeDramRetirementFailure, base, sink)
	case nvml.EventTypeGpuUnavailableError:
		b.log.Info("GPU unavailable", "gpu", g.dev.UUID)
		sink.Signal(with(base, health.SignalLost))
	default:
		b.log.V(1).Info("ignoring an event type that was not registered", "gpu", g.dev.UUID, "type", e.EventType)
	}
}

// unattributed handles an event whose device handle matches no GPU and has no readable UUID.
// Usually the handle's GPU is gone: every GPU that no longer answers GetUUID is lost. Only when
// every GPU still answers is the event applied to all of them, failing safe.
func (b *Backend) unattributed(e nvml.EventData, now time.Time, sink Sink) {
	b.stats.add(func(s *Stats) { s.Unattributed++ })
	if b.probeLost(sink) > 0 {
		return
	}
	b.log.Info("event for an unknown GPU: applying it to every GPU", "type", e.EventType, "data", e.EventData)
	for _, g := range b.gpus {
		b.eventSignals(target{gpu: g}, e, now, sink)
	}
}

// probeLost asks every GPU for its UUID and reports those that cannot answer as lost (or as
// needing a reset, when NVML says so).
func (b *Backend) probeLost(sink Sink) int {
	n := 0
	for _, g := range b.gpus {
		if _, ret := g.handle.GetUUID(); ret != nvml.SUCCESS {
			b.log.Info("GPU does not answer", "gpu", g.dev.UUID, "error", ret.Error())
			sink.Signal(health.Signal{Kind: unattributedFault(ret), Device: g.dev.UUID, Time: b.opts.clock.Now()})
			n++
		}
	}
	return n
}
