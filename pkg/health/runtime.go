package health

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// DefaultTickInterval is how often a Runtime ticks its Monitor: quiet periods and probation end
// within a second of when they are due.
const DefaultTickInterval = time.Second

// Clock is what a Runtime needs of a clock. k8s.io/utils/clock's RealClock and its testing
// FakeClock satisfy it, so embedders pass the clock they already have.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RuntimeOptions configure a Runtime.
type RuntimeOptions struct {
	// Clock drives the ticks and stamps the restore; nil means the wall clock.
	Clock Clock
	// TickInterval is how often the Monitor ticks; 0 means DefaultTickInterval.
	TickInterval time.Duration
	// CheckpointPath is the file that keeps sticky faults across restarts; empty turns
	// checkpoints off.
	CheckpointPath string
	// BootID names the current boot (ReadBootID on Linux). Every checkpoint written names it, and a
	// checkpoint of another boot keeps only the faults that survive a reboot.
	BootID string
}

// Runtime is everything an embedder needs to run a Monitor: it builds the Tracker and Monitor,
// restores the checkpoint at start, ticks the Monitor on its clock, saves the checkpoint whenever
// the sticky state changes, and runs the backend that feeds it. The agent, the device plugin and
// `gpuhealth watch` all run on it; a device plugin or DRA driver that embeds the library writes
// no loop of its own:
//
//	rt, err := health.NewRuntime(policy, backend.Devices(), health.RuntimeOptions{CheckpointPath: path, BootID: bootID})
//	if restored, err := rt.Restore(); err != nil { log it: the GPUs are read afresh }
//	go rt.Run(ctx, func(ctx context.Context, m *health.Monitor) error { return backend.Run(ctx, m) })
//	sub := rt.Monitor().Subscribe() // and report each Update
type Runtime struct {
	monitor *Monitor
	opts    RuntimeOptions
	// saved is the device part of the last checkpoint written or restored, so unchanged state
	// is not written again; savedCursors likewise for the cursors.
	saved, savedCursors []byte
	// cursorDirty says a cursor moved without any sticky change: the next tick saves it.
	cursorDirty bool
	// unsaved is set while the last checkpoint write failed: every tick tries again, and the
	// embedder reports not ready (CheckpointSaved). saveFailures counts failed writes.
	unsaved      atomic.Bool
	saveFailures atomic.Uint64
	// notes are what Restore left out of the checkpoint (a newer release's additions).
	notes CheckpointNotes
}

// CheckpointSaved reports whether every sticky change is in the checkpoint (true with
// checkpoints off). While it is false a restart would lose faults: embedders report not ready.
func (r *Runtime) CheckpointSaved() bool { return !r.unsaved.Load() }

// CheckpointFailures counts the checkpoint writes that failed.
func (r *Runtime) CheckpointFailures() uint64 { return r.saveFailures.Load() }

// NewRuntime returns a Runtime for devices under policy. It fails only when the inventory is
// unusable (see NewTracker).
func NewRuntime(policy *Policy, devices []Device, opts RuntimeOptions) (*Runtime, error) {
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.TickInterval <= 0 {
		opts.TickInterval = DefaultTickInterval
	}
	t, err := NewTracker(policy, devices)
	if err != nil {
		return nil, err
	}
	// Every checkpoint this run writes must name this boot, also when there was none to
	// restore: one without it reads as "another boot" next time, and the restart would drop
	// every fault that lasts until a reboot.
	t.SetBootID(opts.BootID)
	return &Runtime{monitor: NewMonitor(t), opts: opts}, nil
}

// Monitor returns the runtime's Monitor: subscribe to it, or feed it drains.
func (r *Runtime) Monitor() *Monitor { return r.monitor }

// Restore loads the checkpoint into the Monitor; call it once, before Run. restored is false
// without an error when checkpoints are off or there is no file yet. An unreadable or
// inconsistent checkpoint returns an error and changes nothing: the embedder logs it and starts
// from what the GPUs say, never stays down over it.
func (r *Runtime) Restore() (restored bool, err error) {
	if r.opts.CheckpointPath == "" {
		return false, nil
	}
	cp, notes, err := ReadCheckpointNotes(r.opts.CheckpointPath)
	r.notes = notes
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := r.monitor.Restore(cp, r.opts.BootID, r.opts.Clock.Now()); err != nil {
		return false, fmt.Errorf("checkpoint %s: %w", r.opts.CheckpointPath, err)
	}
	if cp.BootID == r.opts.BootID {
		r.saved, r.savedCursors, _ = savedParts(r.monitor.Tracker().Checkpoint())
	} // else the first save rewrites it, naming this boot
	return true, nil
}

// RestoreNotes says what Restore left out of the checkpoint it read: unknown fields and entries
// of a newer release (log them when not Empty).
func (r *Runtime) RestoreNotes() CheckpointNotes { return r.notes }

// Run ticks the Monitor and saves checkpoints until ctx ends. When feed is not nil it runs too,
// with the Monitor as its sink (a backend's Run, adapted): a feed that fails stops Run with its
// error; a feed that returns nil (a scenario that ended) leaves the ticks and saves running. Run
// returns only after feed has. A failed checkpoint write is counted (CheckpointFailures), logged
// (ctx's logr logger; the first failure and then sparsely) and tried again at every tick until
// it succeeds; meanwhile CheckpointSaved is false.
func (r *Runtime) Run(ctx context.Context, feed func(context.Context, *Monitor) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		feedDone chan struct{} // closed when the feed returns; nil once seen, or without a feed
		feedErr  error         // the feed's error, read once feedDone is closed
	)
	if feed != nil {
		feedDone = make(chan struct{})
		go func() {
			defer close(feedDone)
			feedErr = feed(ctx, r.monitor)
		}()
	}
	var updates, cursorMoved <-chan struct{}
	var sub *Subscription
	if r.opts.CheckpointPath != "" {
		sub = r.monitor.Subscribe()
		defer sub.Close()
		updates = sub.C()
		cursorMoved = r.monitor.cursorMoved
	}
	tick := r.opts.Clock.After(r.opts.TickInterval)
	for {
		select {
		case <-ctx.Done():
			if feedDone != nil {
				<-feedDone
			}
			return nil
		case <-feedDone:
			feedDone = nil
			if feedErr != nil && ctx.Err() == nil {
				return feedErr
			}
		case now := <-tick:
			r.monitor.Tick(now)
			tick = r.opts.Clock.After(r.opts.TickInterval)
			if r.cursorDirty || r.unsaved.Load() {
				r.save(ctx, false)
			}
		case <-updates:
			if _, ok := sub.Next(); ok {
				r.save(ctx, false)
			}
		case <-cursorMoved:
			r.save(ctx, true)
		}
	}
}

// savedParts are what decide whether a checkpoint is worth writing: its sticky devices (and the
// requests applied) and the sources' cursors (its time changes with every signal and alone is
// no reason to write).
func savedParts(cp Checkpoint) (devices, cursors []byte, err error) {
	if devices, err = json.Marshal(struct {
		D []CheckpointedDevice
		R map[string]time.Time
	}{cp.Devices, cp.Requests}); err != nil {
		return nil, nil, err
	}
	cursors, err = json.Marshal(cp.Cursors)
	return devices, cursors, err
}

// save writes the checkpoint when its sticky devices or cursors differ from the last ones
// written. With cursorOnly (a cursor moved), a checkpoint whose devices did not change waits for
// the next tick: a storm of application XIDs in the kernel log then costs one write a tick,
// not one per record, and a crash in between re-applies at most a tick of records that changed
// nothing sticky.
func (r *Runtime) save(ctx context.Context, cursorOnly bool) {
	cp := r.monitor.Tracker().Checkpoint()
	devices, cursors, err := savedParts(cp)
	sameDevices := err == nil && bytes.Equal(devices, r.saved)
	if sameDevices && bytes.Equal(cursors, r.savedCursors) {
		r.cursorDirty = false
		return
	}
	if sameDevices && cursorOnly {
		r.cursorDirty = true
		return
	}
	if err == nil {
		err = WriteCheckpoint(r.opts.CheckpointPath, cp)
	}
	if err != nil {
		n := r.saveFailures.Add(1)
		r.unsaved.Store(true)
		if n&(n-1) == 0 { // the 1st, 2nd, 4th, 8th... failure: a full disk does not flood the log
			logr.FromContextOrDiscard(ctx).Error(err, "Writing the checkpoint failed; trying again every tick, not ready until it is saved",
				"path", r.opts.CheckpointPath, "failures", n)
		}
		return
	}
	if r.unsaved.Swap(false) {
		logr.FromContextOrDiscard(ctx).Info("The checkpoint is saved again", "path", r.opts.CheckpointPath, "failures", r.saveFailures.Load())
	}
	r.saved, r.savedCursors, r.cursorDirty = devices, cursors, false
}
