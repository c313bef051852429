// Package report holds what every reporter shares: the Syncer contract, the damped Writer
// that drives a Syncer, and the AnnotationWriter through which everything the agent writes on its
// Node's annotations goes (the reporters, remediation's states, the pending evictions). Each sink
// (Node annotations, DeviceTaintRules, the Node condition, ...) lives in a subpackage and only has
// to say how to make the API server match one snapshot.
package report

import (
	"context"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Syncer makes one sink in the API server match a snapshot. Sync must read what is there and
// write only what differs; it returns how many writes it made. It is only ever called from one
// goroutine, always with the latest snapshot.
type Syncer interface {
	Name() string
	Sync(ctx context.Context, snap health.Snapshot) (writes int, err error)
}

// Starter is implemented by syncers that need to start something (informers) before the first
// Sync. Start returns once they are ready; trigger asks the Writer for a Sync, for example when
// an informer sees someone else change the objects the syncer owns.
type Starter interface {
	Start(ctx context.Context, trigger func()) error
}

// Pacer is implemented by syncers with a write of their own due at a time (a retry, a probe): after a
// successful Sync the Writer syncs again by NextSync, when that comes before the resync. Zero
// means nothing is due.
type Pacer interface {
	NextSync() time.Time
}

// Observer receives what a Writer does, for metrics.
type Observer interface {
	// ObserveSync reports one Sync: the writes it made, how long it took on the Writer's clock
	// and its error.
	ObserveSync(reporter string, writes int, took time.Duration, err error)
}

// WriterOptions tune a Writer. Zero values take the defaults.
type WriterOptions struct {
	// Resync is how often the Writer syncs even when nothing changed (default 5m): it repairs
	// anything someone else changed that no informer reported.
	Resync time.Duration
	// BaseDelay and MaxDelay bound the exponential backoff after errors (defaults 100ms, 30s).
	BaseDelay, MaxDelay time.Duration
	Clock               clock.WithTicker
	Observer            Observer
}

// Writer is a damped writer: Report only records the latest snapshot and wakes the worker, so
// a storm of reports coalesces into one Sync; failed syncs retry with exponential backoff (a
// conflict is just another error); and a periodic resync keeps the sink honest.
type Writer struct {
	syncer Syncer
	opts   WriterOptions
	queue  workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	latest health.Snapshot
	has    bool
	synced bool
	// reported counts Reports; settled is the highest report a finished Sync (successful or
	// not) started from, and settledCh is closed and replaced whenever a Sync finishes.
	reported, settled uint64
	settledCh         chan struct{}
}

const queueKey = "sync"

// NewWriter returns a Writer for s.
func NewWriter(s Syncer, opts WriterOptions) *Writer {
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	if opts.BaseDelay <= 0 {
		opts.BaseDelay = 100 * time.Millisecond
	}
	if opts.MaxDelay <= 0 {
		opts.MaxDelay = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	q := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BaseDelay, opts.MaxDelay),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: s.Name(), Clock: opts.Clock},
	)
	return &Writer{syncer: s, opts: opts, queue: q, settledCh: make(chan struct{})}
}

// Name is the syncer's name.
func (w *Writer) Name() string { return w.syncer.Name() }

// Report records snap as the state to write and returns at once.
func (w *Writer) Report(_ context.Context, snap health.Snapshot) error {
	w.mu.Lock()
	w.latest, w.has = snap, true
	w.reported++
	w.mu.Unlock()
	w.queue.Add(queueKey)
	return nil
}

// Reported returns how many snapshots have been reported so far: the number of the latest.
func (w *Writer) Reported() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reported
}

// WaitSettled blocks until a Sync that started from report n (see Reported) or a later one has
// finished, successfully or not, or ctx ends. It reports whether it settled. The agent uses it
// to keep the sinks schedulers read ahead of the others.
func (w *Writer) WaitSettled(ctx context.Context, n uint64) bool {
	for {
		w.mu.Lock()
		settled, ch := w.settled >= n, w.settledCh
		w.mu.Unlock()
		if settled {
			return true
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// Synced reports whether the last Sync succeeded.
func (w *Writer) Synced() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.synced
}

// Trigger asks for a Sync of the latest snapshot, for changes the snapshot does not carry.
func (w *Writer) Trigger() { w.queue.Add(queueKey) }

// Run starts the syncer (if it is a Starter) and processes syncs until ctx is done. It returns
// an error only when the syncer cannot start (not when ctx ends while it starts).
func (w *Writer) Run(ctx context.Context) error {
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("reporter", w.Name()))
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	if st, ok := w.syncer.(Starter); ok {
		if err := st.Start(ctx, w.Trigger); err != nil {
			w.queue.ShutDown()
			if ctx.Err() != nil {
				return nil // stopped while starting (caches still syncing): a shutdown, not a failure
			}
			return err
		}
	}
	for w.processNext(ctx) {
	}
	return nil
}

func (w *Writer) processNext(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	w.mu.Lock()
	snap, has, report := w.latest, w.has, w.reported
	w.mu.Unlock()
	if !has {
		return true // nothing reported yet; the first Report queues a sync
	}
	start := w.opts.Clock.Now()
	writes, err := w.syncer.Sync(ctx, snap)
	if w.opts.Observer != nil {
		w.opts.Observer.ObserveSync(w.Name(), writes, w.opts.Clock.Since(start), err)
	}
	w.mu.Lock()
	w.synced = err == nil
	w.settled = max(w.settled, report)
	close(w.settledCh)
	w.settledCh = make(chan struct{})
	w.mu.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return true
		}
		logger.Error(err, "Sync failed; retrying with backoff", "retries", w.queue.NumRequeues(key))
		w.queue.AddRateLimited(key)
		return true
	}
	if writes > 0 {
		logger.V(2).Info("Synced", "writes", writes)
	}
	w.queue.Forget(key)
	next := w.opts.Resync
	if p, ok := w.syncer.(Pacer); ok {
		if at := p.NextSync(); !at.IsZero() {
			next = min(next, max(at.Sub(w.opts.Clock.Now()), 0))
		}
	}
	w.queue.AddAfter(key, next)
	return true
}
