package agent

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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
	dedup *kmsg.Dedup
	up    atomic.Bool

	// reopen opens the kernel log again after a read error (nil when it is off); the first
	// delay doubles up to the largest.
	reopen                     func() (*kmsg.Source, error)
	backoffInitial, backoffMax time.Duration
	reopens                    atomic.Uint64

	mu     sync.Mutex
	source *kmsg.Source
	closed bool
}

// Kernel-log reopening after a read error: first delay and largest delay.
const (
	KernelLogBackoffInitial = time.Second
	KernelLogBackoffMax     = time.Minute
)

// OpenKernelLog opens the kernel log as cfg says for devices. When it is off, or cannot be read
// (no such device, no CAP_SYSLOG), the KernelLog it returns has no source, and an unreadable
// log is one warning in the log, never an error: NVML still works.
func OpenKernelLog(ctx context.Context, cfg config.KernelLogConfig, devices []health.Device, bootID string) *KernelLog {
	k := &KernelLog{dedup: kmsg.NewDedup(kmsg.DefaultDedupWindow)}
	if cfg.Enabled == nil || !*cfg.Enabled {
		return k
	}
	opts := kmsg.SourceOptions{Path: cfg.Path, BootID: bootID, Dedup: k.dedup}
	src, err := kmsg.OpenSource(devices, opts)
	if err != nil {
		klog.FromContext(ctx).Info("Warning: the kernel log is not read; XIDs logged while the agent is down, and GPUs NVML cannot open, are missed",
			"path", cfg.Path, "err", err.Error(), "hint", kmsg.Hint(err))
		return k
	}
	k.source = src
	k.reopen = func() (*kmsg.Source, error) { return kmsg.OpenSource(devices, opts) }
	k.backoffInitial, k.backoffMax = KernelLogBackoffInitial, KernelLogBackoffMax
	k.up.Store(true)
	return k
}

// Reopens counts the times the kernel log was opened again after a read error.
func (k *KernelLog) Reopens() uint64 { return k.reopens.Load() }

func (k *KernelLog) current() *kmsg.Source {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.source
}

// Up reports whether the kernel log is being read.
func (k *KernelLog) Up() bool { return k.up.Load() }

// Stats returns the source's counts; zero when there is no source.
func (k *KernelLog) Stats() kmsg.Stats {
	src := k.current()
	if src == nil {
		return kmsg.Stats{}
	}
	return src.Stats()
}

// XIDSources returns how many XIDs each source reported, and how many of them the other one
// had already reported.
func (k *KernelLog) XIDSources() map[string]kmsg.DedupStats { return k.dedup.Stats() }

// Admit reports whether the backend's signal should be applied (see kmsg.Dedup).
func (k *KernelLog) Admit(sig health.Signal) bool { return k.dedup.Admit(BackendSource, sig) }

// Close closes the kernel log.
func (k *KernelLog) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil // closed before: once is enough
	}
	k.closed = true
	if k.source == nil {
		return nil
	}
	return k.source.Close()
}

// Run runs backend (the GPU backend's Run, adapted) and the kernel log side by side, both
// feeding mon, until ctx ends or the backend fails. The kernel log failing is not the backend
// failing: it is logged and reported down, the backend carries on alone, and the log is opened
// again after a delay (1 s, doubling up to a minute), resuming after the last record applied
// (the Monitor's cursor), until it reads again.
func (k *KernelLog) Run(ctx context.Context, mon *health.Monitor, backend func(context.Context) error) error {
	if k.current() == nil {
		return backend(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return backend(gctx) })
	g.Go(func() error {
		k.readReopening(gctx, mon)
		return nil
	})
	return g.Wait()
}

// readReopening reads the kernel log into mon until ctx ends or Close, opening it again after
// each read error.
func (k *KernelLog) readReopening(ctx context.Context, mon *health.Monitor) {
	logger := klog.FromContext(ctx)
	delay := k.backoffInitial
	for {
		started := time.Now()
		err := k.current().Run(ctx, mon)
		k.up.Store(false)
		if ctx.Err() != nil || k.isClosed() {
			return
		}
		if time.Since(started) > k.backoffMax {
			delay = k.backoffInitial // it read for a good while: a new failure, not the same one
		}
		logger.Error(err, "Stopped reading the kernel log; NVML alone until it is opened again", "retryIn", delay)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, k.backoffMax)
			src, err := k.reopen()
			if err == nil && k.swap(src) {
				k.reopens.Add(1)
				k.up.Store(true)
				logger.Info("Reading the kernel log again", "reopens", k.reopens.Load())
				break
			}
			if err == nil { // closed meanwhile
				_ = src.Close()
				return
			}
			logger.Info("The kernel log cannot be opened yet", "err", err.Error(), "retryIn", delay)
		}
	}
}

func (k *KernelLog) isClosed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closed
}

// swap makes src the source, closing the old one; false after Close.
func (k *KernelLog) swap(src *kmsg.Source) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	_ = k.source.Close()
	k.source = src
	return true
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
