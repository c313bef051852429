package kmsg

import (
	"context"
	"errors"
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
	// RelaySocket, when set, is where a Relay listens: the log is read from it, not from Path.
	RelaySocket string
	// Devices are the GPUs the kernel log's lines are mapped to (by PCI bus ID).
	Devices []health.Device
	// BootID names the current boot (see SourceOptions).
	BootID string
	// startWait is how long a relay that is not listening yet is waited for before the
	// warning; 0 means relayStartWait. Tests shorten it.
	startWait time.Duration
}

// NewCompanion returns a Companion without a kernel log: the backend runs alone.
func NewCompanion() *Companion { return &Companion{dedup: health.NewDedup(health.DefaultDedupWindow)} }

// relayStartWait is how long OpenCompanion waits for a relay that is not listening yet (its
// container starts just before the agent's) before it warns.
const relayStartWait = 2 * time.Second

// OpenCompanion opens the kernel log for opts.Devices. Where it cannot be read (no such device,
// no CAP_SYSLOG) the Companion it returns has no source, and that is one warning in ctx's log,
// never an error: the backend still works. With opts.RelaySocket the log is read from that
// Relay; one that does not answer or cannot read the log is the same warning, but Run keeps
// connecting again (after 1 s, doubling up to a minute) until it reads, as after a read error.
func OpenCompanion(ctx context.Context, opts CompanionOptions) *Companion {
	c := NewCompanion()
	sopts := SourceOptions{Path: opts.Path, RelaySocket: opts.RelaySocket, BootID: opts.BootID, Dedup: c.dedup}
	open := func() (*Source, error) { return OpenSource(opts.Devices, sopts) }
	src, err := open()
	wait := opts.startWait
	if wait == 0 {
		wait = relayStartWait
	}
	for deadline := time.Now().Add(wait); errors.Is(err, ErrRelayUnreachable) && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return c
		case <-time.After(wait / 20):
		}
		src, err = open()
	}
	if err != nil {
		from := []any{"path", opts.Path}
		if opts.RelaySocket != "" {
			from = []any{"relay", opts.RelaySocket}
		}
		logr.FromContextOrDiscard(ctx).Info("Warning: the kernel log is not read; XIDs logged while the agent is down, and GPUs NVML cannot open, are missed",
			append(from, "err", err.Error(), "hint", Hint(err))...)
		if opts.RelaySocket == "" {
			return c // a device this process may not read stays so
		}
	} else {
		c.source = src
		c.up.Store(true)
	}
	c.reopen = open
	c.backoffInitial, c.backoffMax = CompanionBackoffInitial, CompanionBackoffMax
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
	if c.reopen == nil {
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
// each read error (and first, when it could not be opened at the start).
func (c *Companion) readReopening(ctx context.Context, mon *health.Monitor) {
	logger := logr.FromContextOrDiscard(ctx)
	delay := c.backoffInitial
	for {
		if src := c.current(); src != nil {
			started := time.Now()
			err := src.Run(ctx, mon)
			c.up.Store(false)
			if ctx.Err() != nil || c.isClosed() {
				return
			}
			if time.Since(started) > c.backoffMax {
				delay = c.backoffInitial // it read for a good while: a new failure, not the same one
			}
			logger.Error(err, "Stopped reading the kernel log; NVML alone until it is opened again", "retryIn", delay)
		}
		if !c.reopenAfter(ctx, &delay) {
			return
		}
	}
}

// reopenAfter opens the kernel log again, waiting delay before each try and doubling it, until
// it is open (true) or ctx ends or Close (false).
func (c *Companion) reopenAfter(ctx context.Context, delay *time.Duration) bool {
	logger := logr.FromContextOrDiscard(ctx)
	for {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(*delay):
		}
		*delay = min(2**delay, c.backoffMax)
		src, err := c.reopen()
		if err != nil {
			logger.Info("The kernel log cannot be opened yet", "err", err.Error(), "hint", Hint(err), "retryIn", *delay)
			continue
		}
		if !c.swap(src) { // closed meanwhile
			_ = src.Close()
			return false
		}
		c.reopens.Add(1)
		c.up.Store(true)
		logger.Info("Reading the kernel log again", "reopens", c.reopens.Load())
		return true
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
	if c.source != nil {
		_ = c.source.Close()
	}
	c.source = src
	return true
}

// BackendFeed returns mon as the GPU backend's sink: the backend's XIDs the kernel log reported
// already are left out, and observe, when not nil, hears of every signal applied (see
// health.Dedup.Feed). The backend's signals go straight to the health library through it.
func (c *Companion) BackendFeed(mon *health.Monitor, observe func(health.Signal)) *health.Feed {
	return c.dedup.Feed(mon, BackendSourceName, observe)
}
