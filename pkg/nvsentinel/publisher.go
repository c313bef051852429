package nvsentinel

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// Defaults of Options.
const (
	// DefaultSocket is where NVSentinel's chart puts the platform-connector's socket on the host
	// (its hostPath /var/run/nvsentinel, mounted at /var/run in its pods).
	DefaultSocket = "/var/run/nvsentinel/nvsentinel.sock"
	// DefaultProbe is how often an idle publisher checks that NVSentinel is still the one it
	// told: a restarted platform-connector knows nothing, and gets everything again.
	DefaultProbe   = 10 * time.Second
	DefaultTimeout = 5 * time.Second
)

// DefaultBackoff paces the retries of a failed send: 1s, doubling, at most 30s, ±10%.
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}
}

// Results of one send, as Observer.ObserveSend names them.
const (
	ResultOK    = "ok"
	ResultError = "error"
	// ResultUnavailable: there is no socket (NVSentinel not installed, or restarting); nothing
	// was dialled.
	ResultUnavailable = "unavailable"
)

// Results lists every result, for metrics that start at zero.
func Results() []string { return []string{ResultOK, ResultError, ResultUnavailable} }

// ErrUnavailable is returned by Flush when the socket does not exist.
var ErrUnavailable = errors.New("NVSentinel's platform-connector socket does not exist")

// Observer receives what a Publisher does, for metrics.
type Observer interface {
	// ObserveSend reports one send of events with its result.
	ObserveSend(result string, events int)
	// ObservePending reports how many events wait for delivery (0: NVSentinel is up to date).
	ObservePending(events int)
}

// Options configure a Publisher. The zero value, with MapOptions.NodeName set, is ready to use.
type Options struct {
	MapOptions
	// Socket is the platform-connector's Unix socket (default DefaultSocket).
	Socket string
	// Clock stamps events and paces retries and probes (default: the real clock).
	Clock clock.Clock
	// Backoff paces the retries of failed sends (default DefaultBackoff).
	Backoff wait.Backoff
	// Probe is how often an idle publisher checks its connection (default DefaultProbe).
	Probe time.Duration
	// Timeout bounds one send (default DefaultTimeout).
	Timeout time.Duration
	// Observer, when set, is told of every send and of what is pending.
	Observer Observer
}

func (o Options) withDefaults() Options {
	if o.Socket == "" {
		o.Socket = DefaultSocket
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Backoff == (wait.Backoff{}) {
		o.Backoff = DefaultBackoff()
	}
	if o.Probe <= 0 {
		o.Probe = DefaultProbe
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return o
}

// stamped is an event and when gpuhealth made it: its generatedTimestamp.
type stamped struct {
	ev *datamodels.HealthEvent
	at time.Time
}

// twin is a healthy event to deliver, made from the fault it ends.
type twin struct {
	stamped
	from *datamodels.HealthEvent
}

// item is one event of a batch.
type item struct {
	stamped
	key   Key
	clear bool
	twin  *twin
}

// Publisher keeps NVSentinel's view of one node's GPUs in step with gpuhealth's: every fault is
// an unhealthy event, and a fault that ends gets its healthy twin. It keeps the state it wants
// NVSentinel to have per GPU, check and error code, so nothing is lost while NVSentinel is away:
// a send that fails is retried with backoff, and after the connection was lost (the socket went,
// or was made anew by a restarted platform-connector, which remembers nothing) everything is sent
// again, faults included, with a twin for each fault that ended meanwhile. At its first send it
// also clears what it does not find faulty (a fault that ended while gpuhealth was not running).
//
// Update and Flush do the work; Run drives them from a health.Subscription, or a caller does
// (the agent's damped writer). It is safe for use by several goroutines.
type Publisher struct {
	opts Options
	conn connection

	mu sync.Mutex
	// faults are the faults wanted now.
	faults map[Key]stamped
	// told are the faults NVSentinel may hold: each unhealthy event sent (or tried) until its
	// twin is delivered.
	told map[Key]*datamodels.HealthEvent
	// twins wait for delivery; acked are the faults the current connection acknowledged.
	twins map[Key]*twin
	acked map[Key]*datamodels.HealthEvent
	// clears are the clears at start, until delivered; nil before the first Update.
	clears *startupClears
	// delay is the backoff of the current failure streak; next is when to send again (after a
	// failure) or to check the connection (idle).
	delay   wait.DelayFunc
	failing bool
	next    time.Time
}

// NewPublisher returns a publisher to the platform-connector at opts.Socket. It dials nothing
// until the first Flush; call Close when done.
func NewPublisher(opts Options) *Publisher {
	opts = opts.withDefaults()
	return &Publisher{
		opts: opts, conn: connection{socket: opts.Socket},
		faults: map[Key]stamped{}, told: map[Key]*datamodels.HealthEvent{},
		twins: map[Key]*twin{}, acked: map[Key]*datamodels.HealthEvent{},
		delay: opts.Backoff.DelayFunc(),
	}
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn.close()
}

// Update records snap as the state NVSentinel is to have.
func (p *Publisher) Update(snap health.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.opts.Clock.Now()
	next := map[Key]stamped{}
	for _, f := range Faults(snap, p.opts.MapOptions) {
		if old, ok := p.faults[f.Key]; ok && proto.Equal(old.ev, f.Event) {
			next[f.Key] = old // the same event: the same timestamp, so that a resend is the same
			continue
		}
		next[f.Key] = stamped{ev: f.Event, at: now}
	}
	p.faults = next
	for k, told := range p.told {
		f, ok := next[k]
		switch {
		case ok && f.ev.IsFatal:
			delete(p.twins, k) // back, or still there: its fatal event is what counts
		case ok && !told.IsFatal:
			// Still not fatal: a twin already waiting (for an earlier fatal event) still must go.
		default:
			// Gone, or down from fatal to not fatal, which does not end a fatal entry in NVSentinel.
			if t, waiting := p.twins[k]; waiting {
				t.from = told
			} else {
				p.twins[k] = &twin{stamped: stamped{ev: Twin(told), at: now}, from: told}
			}
		}
	}
	if p.clears == nil {
		p.clears = newStartupClears(snap, now)
	}
	p.clears.faulty(next)
	p.observePending()
}

// Flush sends what NVSentinel lacks, unless a failed send's backoff has not passed. It returns
// the send's error (ErrUnavailable without a socket); the state stays for the next Flush.
func (p *Publisher) Flush(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.observePending()
	now := p.opts.Clock.Now()
	if p.failing && now.Before(p.next) {
		return nil
	}
	present := p.conn.check()
	if !p.conn.connected {
		clear(p.acked) // whoever answers next may know nothing
	}
	batch := p.batch()
	if len(batch) == 0 {
		p.settle(ctx, now)
		return nil
	}
	if !present {
		p.fail(ctx, now, ResultUnavailable, len(batch), ErrUnavailable)
		return ErrUnavailable
	}
	events := make([]*datamodels.HealthEvent, len(batch))
	for i, it := range batch {
		ev := proto.Clone(it.ev).(*datamodels.HealthEvent)
		ev.GeneratedTimestamp = timestamppb.New(it.at)
		events[i] = ev
		if !it.ev.IsHealthy {
			p.told[it.key] = it.ev // told as soon as tried: a send that fails may still have arrived
		}
	}
	sendCtx, cancel := context.WithTimeout(ctx, p.opts.Timeout)
	defer cancel()
	if err := p.conn.send(sendCtx, &datamodels.HealthEvents{Version: Version, Events: events}); err != nil {
		if ctx.Err() != nil {
			// Stopping, not NVSentinel's failure; whether it arrived is unknown.
			p.conn.drop()
			clear(p.acked)
			return ctx.Err()
		}
		p.fail(ctx, now, ResultError, len(batch), err)
		return err
	}
	p.observe(ResultOK, len(batch))
	for _, it := range batch {
		switch {
		case it.clear:
			p.clears.delivered(it.key)
		case it.twin != nil:
			delete(p.twins, it.key)
			delete(p.acked, it.key)
			if p.told[it.key] == it.twin.from {
				delete(p.told, it.key)
			}
		default:
			p.acked[it.key] = it.ev
		}
	}
	klog.FromContext(ctx).V(2).Info("Sent to NVSentinel", "socket", p.opts.Socket, "events", len(batch))
	p.settle(ctx, now)
	return nil
}

// batch returns what NVSentinel lacks, in order: the clears at start, the twins, then the
// faults it has not acknowledged on this connection, each group by key.
func (p *Publisher) batch() []item {
	var out []item
	if p.clears != nil {
		out = p.clears.items(p.opts.NodeName)
	}
	for _, k := range slices.SortedFunc(maps.Keys(p.twins), compareKeys) {
		t := p.twins[k]
		out = append(out, item{stamped: t.stamped, key: k, twin: t})
	}
	var faults []item
	for k, f := range p.faults {
		if acked, ok := p.acked[k]; !ok || !proto.Equal(acked, f.ev) {
			faults = append(faults, item{stamped: f, key: k})
		}
	}
	slices.SortFunc(faults, func(a, b item) int { return compareKeys(a.key, b.key) })
	return append(out, faults...)
}

// settle records a Flush with nothing left to send: the streak of failures is over, and the
// connection is checked again after a probe period.
func (p *Publisher) settle(ctx context.Context, now time.Time) {
	if p.failing {
		klog.FromContext(ctx).Info("NVSentinel is up to date again", "socket", p.opts.Socket)
		p.failing = false
		p.delay = p.opts.Backoff.DelayFunc()
	}
	p.next = now.Add(p.opts.Probe)
}

// fail records a failed send of n events and when to try again.
func (p *Publisher) fail(ctx context.Context, now time.Time, result string, n int, err error) {
	p.observe(result, n)
	p.conn.drop()
	clear(p.acked)
	logger := klog.FromContext(ctx)
	if !p.failing {
		logger.Info("NVSentinel's platform-connector is unreachable; gpuhealth keeps what it has to tell and retries with backoff",
			"socket", p.opts.Socket, "events", n, "err", err)
	} else {
		logger.V(2).Info("Sending to NVSentinel failed again", "socket", p.opts.Socket, "events", n, "err", err)
	}
	p.failing = true
	p.next = now.Add(p.delay())
}

// NextAttempt returns when Flush has work again: the retry after a failed send, or the next
// check of the connection.
func (p *Publisher) NextAttempt() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

func (p *Publisher) observe(result string, n int) {
	if p.opts.Observer != nil {
		p.opts.Observer.ObserveSend(result, n)
	}
}

func (p *Publisher) observePending() {
	if p.opts.Observer != nil {
		p.opts.Observer.ObservePending(len(p.batch()))
	}
}
