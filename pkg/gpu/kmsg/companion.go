package kmsg

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// BackendSourceName names the GPU backend (NVML) beside the kernel log in [health.Dedup]'s
// counts and in metrics.
const BackendSourceName = "nvml"

// Companion backoff after a read error: the first delay, doubled up to the largest.
const (
	CompanionBackoffInitial = time.Second
	CompanionBackoffMax     = time.Minute
)

// Companion is the kernel log read beside a GPU backend, as the agent and the device plugin
// run it: a [Source] opened again after read errors, the [Dedup] of the XIDs both report, and
// whether the source is up. A Companion from [NewCompanion] has no source: it only
// de-duplicates, which with one source passes everything.
//
// Run it around the backend:
//
//	c := kmsg.OpenCompanion(ctx, kmsg.CompanionOptions{Devices: devs, BootID: boot})
//	defer c.Close()
//	err := c.Run(ctx, mon, func(ctx context.Context) error {
//		return backend.Run(ctx, c.BackendFeed(mon, nil))
//	})
type Companion struct {
	dedup *health.Dedup
	up    atomic.Bool

	// reopen opens the kernel log again after a read error (nil when there is no source).
	reopen                     func() (*Source, error)
	backoffInitial, backoffMax time.Duration
	reopens                    atomic.Uint64

	mu     sync.Mutex
	source *Source
	closed bool
}

// CompanionOptions say what OpenCompanion reads.
type CompanionOptions struct {
	// Path is the kernel log device; empty means DevKmsg.
	Path string
	// Devices are the GPUs the kernel log's lines are mapped to (by PCI bus ID).
	Devices []health.Device
	// BootID names the current boot (see SourceOptions).
	BootID string
}

// NewCompanion returns a Companion without a kernel log: the backend runs alone.
func NewCompanion() *Companion { return &Companion{dedup: health.NewDedup(health.DefaultDedupWindow)} }

// OpenCompanion opens the kernel log for opts.Devices. Where it cannot be read (no such device,
// no CAP_SYSLOG) the Companion it returns has no source, and that is one warning in ctx's log,
// never an error: the backend still works.
func OpenCompanion(ctx context.Context, opts CompanionOptions) *Companion {
	c := NewCompanion()
	sopts := SourceOptions{Path: opts.Path, BootID: opts.BootID, Dedup: c.dedup}
	src, err := OpenSource(opts.Devices, sopts)
	if err != nil {
		logr.FromContextOrDiscard(ctx).Info("Warning: the kernel log is not read; XIDs logged while the agent is down, and GPUs NVML cannot open, are missed",
			"path", opts.Path, "err", err.Error(), "hint", Hint(err))
		return c
	}
	c.source = src
	c.reopen = func() (*Source, error) { return OpenSource(opts.Devices, sopts) }
	c.backoffInitial, c.backoffMax = CompanionBackoffInitial, CompanionBackoffMax
	c.up.Store(true)
	return c
}

// Reopens counts the times the kernel log was opened again after a read error.
func (c *Companion) Reopens() uint64 { return c.reopens.Load() }

func (c *Companion) current() *Source {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.source
}

// Up reports whether the kernel log is being read.
func (c *Companion) Up() bool { return c.up.Load() }

// Stats returns the source's counts; zero when there is no source.
func (c *Companion) Stats() Stats {
	src := c.current()
	if src == nil {
		return Stats{}
	}
	return src.Stats()
}

// XIDSources returns how many XIDs each source reported, and how many of them the other one
// had already reported, by source name (BackendSourceName, SourceName).
func (c *Companion) XIDSources() map[string]health.DedupStats { return c.dedup.Stats() }

// Admit reports whether the backend's signal should be applied (see health.Dedup).
func (c *Companion) Admit(sig health.Signal) bool { return c.dedup.Admit(BackendSourceName, sig) }

// Close closes the kernel log. Closing twice is closing once.
func (c *Companion) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.source == nil {
		return nil
	}
	return c.source.Close()
}

// Run runs backend (the GPU backend's Run, adapted) and the kernel log side by side, both
// feeding mon, until ctx ends or the backend fails. The kernel log failing is not the backend
// failing: it is logged and reported down, the backend carries on alone, and the log is opened
// again after a delay (1 s, doubling up to a minute), resuming after the last record applied
// (the Monitor's cursor), until it reads again.
func (c *Companion) Run(ctx context.Context, mon *health.Monitor, backend func(context.Context) error) error {
	if c.current() == nil {
		return backend(ctx)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return backend(gctx) })
	g.Go(func() error {
		c.readReopening(gctx, mon)
		return nil
	})
	return g.Wait()
}

// readReopening reads the kernel log into mon until ctx ends or Close, opening it again after
// each read error.
func (c *Companion) readReopening(ctx context.Context, mon *health.Monitor) {
	logger := logr.FromContextOrDiscard(ctx)
	delay := c.backoffInitial
	for {
		started := time.Now()
		err := c.current().Run(ctx, mon)
		c.up.Store(false)
		if ctx.Err() != nil || c.isClosed() {
			return
		}
		if time.Since(started) > c.backoffMax {
			delay = c.backoffInitial // it read for a good while: a new failure, not the same one
		}
		logger.Error(err, "Stopped reading the kernel log; NVML alone until it is opened again", "retryIn", delay)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, c.backoffMax)
			src, err := c.reopen()
			if err == nil && c.swap(src) {
				c.reopens.Add(1)
				c.up.Store(true)
				logger.Info("Reading the kernel log again", "reopens", c.reopens.Load())
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

func (c *Companion) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// swap makes src the source, closing the old one; false after Close.
func (c *Companion) swap(src *Source) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	_ = c.source.Close()
	c.source = src
	return true
}

// BackendFeed returns mon as the GPU backend's sink: the backend's XIDs the kernel log reported
// already are left out, and observe, when not nil, hears of every signal applied (see
// health.Dedup.Feed). The backend's signals go straight to the health library through it.
func (c *Companion) BackendFeed(mon *health.Monitor, observe func(health.Signal)) *health.Feed {
	return c.dedup.Feed(mon, BackendSourceName, observe)
}
