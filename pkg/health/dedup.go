package health

import (
	"maps"
	"sync"
	"time"
)

// DefaultDedupWindow is how far apart in time two sources may report one XID. NVML stamps an
// event when it is delivered, the kernel log when the driver logs it; both happen within
// milliseconds of each other, and the window leaves room for a busy node.
const DefaultDedupWindow = 10 * time.Second

// Dedup makes an XID that two sources (NVML and the kernel log) both report count once. Each
// source passes its XID signals through Admit; a signal that matches an unmatched report of the
// same XID on the same GPU by another source within the window is a duplicate. Storms pair up
// one to one, so n XIDs seen by both sources count n times, not 2n and not once. Dedup is safe
// for concurrent use.
type Dedup struct {
	window time.Duration

	mu      sync.Mutex
	pending map[dedupKey][]sighting
	stats   map[string]DedupStats
	admits  int
}

type dedupKey struct {
	device string
	xid    uint32
}

type sighting struct {
	source string
	at     time.Time
}

// DedupStats counts one source's XIDs.
type DedupStats struct {
	// Reported is every XID signal the source passed to Admit.
	Reported uint64
	// Duplicates is how many of them another source had already reported.
	Duplicates uint64
}

// maxPending bounds the unmatched reports kept per GPU and XID; in a storm longer than that,
// the oldest lose their chance to be matched (and count twice), which costs a count, never a fault.
const maxPending = 256

// sweepEvery is how many Admit calls pass between sweeps of keys whose reports all expired.
const sweepEvery = 4096

// NewDedup returns a Dedup matching reports up to window apart (0: DefaultDedupWindow).
func NewDedup(window time.Duration) *Dedup {
	if window <= 0 {
		window = DefaultDedupWindow
	}
	return &Dedup{window: window, pending: map[dedupKey][]sighting{}, stats: map[string]DedupStats{}}
}

// Admit reports whether source's signal s should be applied. Signals other than XIDs always
// are: they are states (lost, recovery action), and applying one twice changes nothing.
func (d *Dedup) Admit(source string, s Signal) bool {
	if s.Kind != SignalXID {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.stats[source]
	st.Reported++
	defer func() { d.stats[source] = st }()
	d.admits++
	if d.admits%sweepEvery == 0 {
		d.sweep(s.Time)
	}

	k := dedupKey{s.Device, s.XID}
	list := d.pending[k]
	// Reports too old to match anything from now on go first (times are close to ordered).
	kept := list[:0]
	for _, p := range list {
		if s.Time.Sub(p.at) <= d.window {
			kept = append(kept, p)
		}
	}
	list = kept
	for i, p := range list {
		if p.source != source && absDuration(s.Time.Sub(p.at)) <= d.window {
			d.pending[k] = append(list[:i], list[i+1:]...)
			st.Duplicates++
			return false
		}
	}
	if len(list) == maxPending {
		list = append(list[:0], list[1:]...)
	}
	d.pending[k] = append(list, sighting{source, s.Time})
	return true
}

// sweep forgets keys whose every report is older than the window as of now.
func (d *Dedup) sweep(now time.Time) {
	for k, list := range d.pending {
		if len(list) == 0 || now.Sub(list[len(list)-1].at) > d.window {
			delete(d.pending, k)
		}
	}
}

// Stats returns each source's counts.
func (d *Dedup) Stats() map[string]DedupStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.stats)
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Feed returns mon as the sink of one of the sources Dedup pairs up (a GPU backend beside the
// kernel log): its XIDs another source reported already are left out, and observe, when not
// nil, hears of every signal applied (the agent measures how long signals waited, and sees
// resets, by it). A Feed offers a backend's sink methods (Signal, Reboot, SetUnmonitored,
// SetCheckUnmonitored) and nothing more of the Monitor's.
func (d *Dedup) Feed(mon *Monitor, source string, observe func(Signal)) *Feed {
	return &Feed{monitor: mon, dedup: d, source: source, observe: observe}
}

// Feed is what Dedup.Feed returns.
type Feed struct {
	monitor *Monitor
	dedup   *Dedup
	source  string
	observe func(Signal)
}

// Signal applies sig unless another source reported it already.
func (f *Feed) Signal(sig Signal) {
	if !f.dedup.Admit(f.source, sig) {
		return
	}
	f.monitor.Signal(sig)
	if f.observe != nil {
		f.observe(sig)
	}
}

// Reboot is the Monitor's.
func (f *Feed) Reboot(bootID string, at time.Time) { f.monitor.Reboot(bootID, at) }

// SetUnmonitored is the Monitor's.
func (f *Feed) SetUnmonitored(uuid string, unmonitored bool) {
	f.monitor.SetUnmonitored(uuid, unmonitored)
}

// SetCheckUnmonitored is the Monitor's: what a backend cannot watch on a GPU (a missing driver
// function, ECC off).
func (f *Feed) SetCheckUnmonitored(uuid string, check Check, unmonitored bool) {
	f.monitor.SetCheckUnmonitored(uuid, check, unmonitored)
}
