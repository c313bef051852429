package agent

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// BackendSource names the GPU backend (NVML) among the XID sources in metrics.
const BackendSource = "nvml"

// KernelLog is the kernel log beside the GPU backend, shared by the agent and the device
// plugin: a source, the de-duplication of XIDs both report, and whether the source is up.
// The zero of a field means "off": a KernelLog without a Source only de-duplicates nothing.
type KernelLog struct {
	source *kmsg.Source
	dedup  *kmsg.Dedup
	up     atomic.Bool
}

// OpenKernelLog opens the kernel log as cfg says for devices. When it is off, or cannot be read
// (no such device, no CAP_SYSLOG), the KernelLog it returns has no source, and an unreadable
// log is one warning in the log, never an error: NVML still works.
func OpenKernelLog(ctx context.Context, cfg config.KernelLogConfig, devices []health.Device, bootID string) *KernelLog {
	k := &KernelLog{dedup: kmsg.NewDedup(kmsg.DefaultDedupWindow)}
	if cfg.Enabled == nil || !*cfg.Enabled {
		return k
	}
	src, err := kmsg.OpenSource(devices, kmsg.SourceOptions{Path: cfg.Path, BootID: bootID, Dedup: k.dedup})
	if err != nil {
		klog.FromContext(ctx).Info("Warning: the kernel log is not read; XIDs logged while the agent is down, and GPUs NVML cannot open, are missed",
			"path", cfg.Path, "err", err.Error(), "hint", kmsg.Hint(err))
		return k
	}
	k.source = src
	k.up.Store(true)
	return k
}

// Up reports whether the kernel log is being read.
func (k *KernelLog) Up() bool { return k.up.Load() }

// Stats returns the source's counts; zero when there is no source.
func (k *KernelLog) Stats() kmsg.Stats {
	if k.source == nil {
		return kmsg.Stats{}
	}
	return k.source.Stats()
}

// XIDSources returns how many XIDs each source reported, and how many of them the other one
// had already reported.
func (k *KernelLog) XIDSources() map[string]kmsg.DedupStats { return k.dedup.Stats() }

// Admit reports whether the backend's signal should be applied (see kmsg.Dedup).
func (k *KernelLog) Admit(sig health.Signal) bool { return k.dedup.Admit(BackendSource, sig) }

// Close closes the kernel log.
func (k *KernelLog) Close() error {
	if k.source == nil {
		return nil
	}
	return k.source.Close()
}

// Run runs backend (the GPU backend's Run, adapted) and the kernel log side by side, both
// feeding mon, until ctx ends or the backend fails. The kernel log failing is not the backend
// failing: it is logged, reported down, and the backend carries on alone.
func (k *KernelLog) Run(ctx context.Context, mon *health.Monitor, backend func(context.Context) error) error {
	if k.source == nil {
		return backend(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return backend(gctx) })
	g.Go(func() error {
		if err := k.source.Run(gctx, mon); err != nil {
			klog.FromContext(ctx).Error(err, "Stopped reading the kernel log; NVML alone from now on")
		}
		k.up.Store(false)
		return nil
	})
	return g.Wait()
}

// dedupSink passes a backend's signals to the Monitor, leaving out the XIDs the kernel log had
// already reported; every other method is the Monitor's.
type dedupSink struct {
	*health.Monitor
	kernelLog *KernelLog
}

// Signal applies sig unless it is a duplicate.
func (s dedupSink) Signal(sig health.Signal) {
	if s.kernelLog.Admit(sig) {
		s.Monitor.Signal(sig)
	}
}

// DedupSink returns mon as a backend's sink whose XIDs are de-duplicated against the kernel log.
func (k *KernelLog) DedupSink(mon *health.Monitor) Sink { return dedupSink{Monitor: mon, kernelLog: k} }
