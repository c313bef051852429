package nvml

import (
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// reportBroken tells sink that g is lost or needs a reset. A lost GPU is remembered: it is not
// registered on an event set again.
func (b *Backend) reportBroken(g *gpu, kind health.SignalKind, at time.Time, sink gpuapi.Sink) {
	if kind == health.SignalLost {
		g.lost.Store(true)
	}
	sink.Signal(health.Signal{Kind: kind, Device: g.dev.UUID, Time: at})
}

// alive asks g something only the hardware can answer: its temperature. NVML serves a GPU's UUID
// from what it read at start, so GetUUID can still answer SUCCESS for a GPU that fell off the
// bus; a sensor reading answers ERROR_GPU_IS_LOST (or ERROR_RESET_REQUIRED). Where the
// temperature cannot tell (the driver lacks the call, the GPU has no sensor, the reading failed
// otherwise) the UUID is all there is to ask.
func (b *Backend) alive(g *gpu) nvml.Return {
	if g.handle == nil {
		return nvml.ERROR_GPU_IS_LOST // not found after a reset
	}
	if b.sym.has(symTemperature) {
		_, ret := g.handle.GetTemperature(nvml.TEMPERATURE_GPU)
		if ret == nvml.SUCCESS || isFault(ret) {
			return ret
		}
	}
	_, ret := g.handle.GetUUID()
	return ret
}

// probeLost asks every GPU whether it is still there (see alive) and reports those that cannot
// answer as lost, or as needing a reset when NVML says so. It returns how many did not answer.
func (b *Backend) probeLost(sink gpuapi.Sink) int {
	n := 0
	for _, g := range b.gpus {
		if ret := b.alive(g); ret != nvml.SUCCESS {
			b.log.Info("GPU does not answer", "gpu", g.dev.UUID, "error", ret.Error())
			b.reportBroken(g, unattributedFault(ret), b.opts.clock.Now(), sink)
			n++
		}
	}
	return n
}

// unattributedFault is the signal for a GPU that does not answer the probe: lost, unless NVML
// says it needs a reset.
func unattributedFault(ret nvml.Return) health.SignalKind {
	if kind, ok := faultOf(ret); ok {
		return kind
	}
	return health.SignalLost
}
