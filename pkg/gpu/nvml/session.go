package nvml

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// A GPU reset needs the GPU free of every client, this backend's NVML session included:
// nvidia-smi refuses a GPU that a monitoring process holds open. So a reset takes NVML away
// from Run (see gate), shuts it down, runs its command, initialises NVML again and takes a fresh
// handle of every GPU before Run goes on. Resets, the re-initialisations Run retries and Close
// are serialised by the session lock.

// errClosed answers a reset after Close.
var errClosed = errors.New("the NVML backend is closed")

// lockSession takes the session lock; it returns ctx's error when ctx ends first.
func (b *Backend) lockSession(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case b.session <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Backend) unlockSession() { <-b.session }

// release takes NVML from the event loop and the sampler (the call in flight ends, the event set
// is freed) and shuts it down, so that the agent holds no GPU open. The session lock must be
// held. When ctx ends first, or Shutdown fails, Run goes on as before.
func (b *Backend) release(ctx context.Context) error {
	initialised, err := b.gate.drain(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the event loop and the sampler to let go of NVML: %w", err)
	}
	if !initialised {
		// Down since an earlier reset: nothing is held.
		return nil
	}
	if err := nvmlError("shutting NVML down", b.lib.Shutdown()); err != nil {
		b.gate.resume()
		return err
	}
	return nil
}

// reacquire initialises NVML again and takes a fresh handle of every GPU by its UUID (the old
// ones died with the session). A GPU that NVML no longer finds did not come back: it has no
// handle and is lost, and the sampler reports it so at its next round. When Init fails NVML is
// down: Run's keeper tries again, and nothing calls NVML meanwhile. The session lock must be
// held.
func (b *Backend) reacquire() error {
	if err := initError(b.lib.Init()); err != nil {
		b.gate.down(err)
		return err
	}
	for _, g := range b.gpus {
		h, ret := b.lib.DeviceGetHandleByUUID(g.dev.UUID)
		if ret != nvml.SUCCESS {
			if !g.lost.Load() {
				b.log.Info("GPU not found after a reset: it is lost", "gpu", g.dev.UUID, "error", ret.Error())
			}
			g.handle = nil
			g.lost.Store(true)
			continue
		}
		g.handle = h
	}
	b.gate.reopen()
	return nil
}

// keepNVML watches for NVML being down after a reset (Init failed). Then every GPU that is not
// lost is unmonitored, and Init is tried again with the wait backoff until it succeeds; the
// event loop's registrations clear the marks again. It returns nil when ctx ends.
func (b *Backend) keepNVML(ctx context.Context, sink gpuapi.Sink) error {
	var delay time.Duration
	for {
		wake, err := b.gate.downState()
		if err == nil {
			delay = 0
			select {
			case <-ctx.Done():
				return nil
			case <-wake:
				continue
			}
		}
		if gone := goneAtInit(err, b.opts.clock.Now()); gone != nil {
			// Not a reset's aftermath: the driver itself went away meanwhile.
			return b.driverWentAway(gone, sink)
		}
		if delay == 0 {
			b.log.Error(err, "NVML is down after a GPU reset: every GPU is unmonitored until it is back")
			for _, g := range b.gpus {
				if !g.lost.Load() {
					b.setUnmonitored(g, sink, true)
				}
			}
		}
		delay = min(max(2*delay, b.opts.backoffInitial), b.opts.backoffMax)
		if !sleepCtx(ctx, b, delay) {
			return nil
		}
		if err := b.retryInit(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if gone := goneAtInit(err, b.opts.clock.Now()); gone != nil {
				return b.driverWentAway(gone, sink)
			}
			b.log.Error(err, "initialising NVML again failed: retrying", "backoff", min(2*delay, b.opts.backoffMax))
			continue
		}
	}
}

// retryInit initialises NVML again when it is down.
func (b *Backend) retryInit(ctx context.Context) error {
	if err := b.lockSession(ctx); err != nil {
		return err
	}
	defer b.unlockSession()
	if _, err := b.gate.downState(); err == nil || b.closed {
		return nil // a reset brought it back meanwhile
	}
	if err := b.reacquire(); err != nil {
		return err
	}
	b.log.Info("NVML is initialised again")
	return nil
}

// sleepCtx waits d on the backend's clock; it returns false when ctx ended first.
func sleepCtx(ctx context.Context, b *Backend, d time.Duration) bool {
	timer := b.opts.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C():
		return true
	}
}
