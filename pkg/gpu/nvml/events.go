package nvml

import (
	"context"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sync/errgroup"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
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
	nvml.EventTypeGpuRecoveryAction |
	nvml.EventMigConfigChange

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
	{nvml.EventMigConfigChange, "migConfigChange"},
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

// Run watches the GPUs until ctx ends: the event loop, the sampler, and the keeper that
// initialises NVML again when that failed after a reset, each in a goroutine that Run owns and
// waits for. It returns nil when ctx ends, a *DriverGoneError when the driver went away under
// it, an *InventoryChangedError when the MIG layout changed, and otherwise an error only when
// watching cannot start (no event set can be created, after the tries WithStartRetries sets). Every event set is freed before
// Run returns. Run may be called once at a time. A reset through CommandResetter parks the
// event loop and the sampler while it runs (see session.go).
func (b *Backend) Run(ctx context.Context, sink gpuapi.Sink) error {
	b.announce(sink)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return b.watchEvents(ctx, sink) })
	g.Go(func() error { return b.sampleLoop(ctx, sink) })
	g.Go(func() error { return b.keepNVML(ctx, sink) })
	return g.Wait()
}

// supportedEvents returns the watched event types a GPU supports, as Run registers them: not
// the ECC events when ECC is off, as they never come.
func (b *Backend) supportedEvents(g *gpu) (uint64, nvml.Return) {
	if b.eventsOff != "" {
		return 0, nvml.ERROR_FUNCTION_NOT_FOUND
	}
	if g.handle == nil {
		return 0, nvml.ERROR_GPU_IS_LOST // not found after a reset
	}
	mask, ret := g.handle.GetSupportedEventTypes()
	mask &= WatchedEvents
	if g.eccDisabled {
		mask &^= eccEvents
	}
	return mask, ret
}

func (b *Backend) setUnmonitored(g *gpu, sink gpuapi.Sink, unmonitored bool) {
	sink.SetUnmonitored(g.dev.UUID, unmonitored)
	for _, m := range g.migs {
		sink.SetUnmonitored(m.UUID, unmonitored)
	}
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
		if g.handle == nil {
			continue // not found after a reset: nothing of it can be read
		}
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
func (b *Backend) handleEvent(e nvml.EventData, sink gpuapi.Sink) {
	now := b.opts.clock.Now()
	if e.EventType == nvml.EventMigConfigChange {
		// Whichever GPU it names, the layout is compared with the inventory at the next round.
		b.migChanged.Store(true)
	}
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

func (b *Backend) eventSignals(t target, e nvml.EventData, now time.Time, sink gpuapi.Sink) {
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
	case nvml.EventMigConfigChange:
		// Noted in handleEvent, before the event is tied to a GPU.
	case nvml.EventTypeSingleBitEccError, nvml.EventTypeDoubleBitEccError:
		b.emitECCAfterEvent(g, e.EventType == nvml.EventTypeDoubleBitEccError, base, sink)
	case nvml.EventTypeSingleBitEccErrorStorm:
		sink.Signal(with(base, health.SignalECCStorm))
	case nvml.EventTypeDramRetirementEvent, nvml.EventTypeDramRetirementFailure:
		b.emitRetirementAfterEvent(g, e.EventType == nvml.EventTypeDramRetirementFailure, base, sink)
	case nvml.EventTypeGpuUnavailableError:
		b.log.Info("GPU unavailable", "gpu", g.dev.UUID)
		b.reportBroken(g, health.SignalLost, now, sink)
	default:
		b.log.V(1).Info("ignoring an event type that was not registered", "gpu", g.dev.UUID, "type", e.EventType)
	}
}

// unattributed handles an event whose device handle matches no GPU and has no readable UUID.
// Usually the handle's GPU is gone: every GPU that no longer answers the probe (see alive) is
// lost. Only when every GPU still answers is the event applied to all of them, failing safe.
func (b *Backend) unattributed(e nvml.EventData, now time.Time, sink gpuapi.Sink) {
	b.stats.add(func(s *Stats) { s.Unattributed++ })
	if b.probeLost(sink) > 0 {
		return
	}
	b.log.Info("event for an unknown GPU: applying it to every GPU", "type", e.EventType, "data", e.EventData)
	for _, g := range b.gpus {
		b.eventSignals(target{gpu: g}, e, now, sink)
	}
}
