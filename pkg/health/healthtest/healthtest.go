// Package healthtest holds the fakes and helpers that tests of the health library, and of code
// that embeds it, share: Eventually, a poll on the real clock for what other goroutines do (an
// informer, the Runtime's loop, a backend); Recorder, a sink that records what a backend sends
// it; and Log, a logger that keeps what code logs.
package healthtest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// EventuallyTimeout is how long Eventually waits: generous, since a test that waits for another
// goroutine must not fail on a slow machine. Nothing is measured by it.
const EventuallyTimeout = 10 * time.Second

// Eventually polls cond every millisecond until it holds, and fails the test naming what it
// waited for when EventuallyTimeout passes first. It waits for what other goroutines do; it is
// never a timed assertion.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, EventuallyTimeout, what, cond)
}

// EventuallyWithin is Eventually with another timeout.
func EventuallyWithin(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Recorder is a sink that records what it is sent: signals, reboots, unmonitored marks and the
// peers' faults, in arrival order. It is safe for concurrent use.
type Recorder struct {
	mu          sync.Mutex
	signals     []health.Signal
	reboots     []string
	unmonitored map[string]bool
	peers       [][]health.PeerFault
}

// Signal records one signal.
func (r *Recorder) Signal(s health.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, s)
}

// Reboot records a reboot's boot ID.
func (r *Recorder) Reboot(bootID string, _ time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reboots = append(r.reboots, bootID)
}

// SetUnmonitored records whether a device's events can be watched.
func (r *Recorder) SetUnmonitored(uuid string, unmonitored bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.unmonitored == nil {
		r.unmonitored = map[string]bool{}
	}
	r.unmonitored[uuid] = unmonitored
}

// SetPeerFaults records a set of the peer nodes' faults.
func (r *Recorder) SetPeerFaults(faults []health.PeerFault, _ time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.peers = append(r.peers, slices.Clone(faults))
}

// Signals returns the signals recorded so far, matching every given filter (none: all).
func (r *Recorder) Signals(match ...func(health.Signal) bool) []health.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []health.Signal
	for _, s := range r.signals {
		if !slices.ContainsFunc(match, func(m func(health.Signal) bool) bool { return !m(s) }) {
			out = append(out, s)
		}
	}
	return out
}

// Take returns the signals recorded so far and forgets them, for a test that checks what came
// since its last look.
func (r *Recorder) Take() []health.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.signals
	r.signals = nil
	return s
}

// TakeUntil waits (Eventually) until a signal matching last has come, and returns and forgets
// every signal recorded by then.
func (r *Recorder) TakeUntil(t testing.TB, what string, last func(health.Signal) bool) []health.Signal {
	t.Helper()
	var got []health.Signal
	Eventually(t, what, func() bool {
		got = append(got, r.Take()...)
		return slices.ContainsFunc(got, last)
	})
	return got
}

// Reboots returns the boot IDs of the reboots recorded so far.
func (r *Recorder) Reboots() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reboots)
}

// Unmonitored reports the last mark recorded for a device, and whether there was one.
func (r *Recorder) Unmonitored(uuid string) (unmonitored, marked bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	unmonitored, marked = r.unmonitored[uuid]
	return unmonitored, marked
}

// PeerFaults returns every set of peer faults recorded, in order.
func (r *Recorder) PeerFaults() [][]health.PeerFault {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.peers)
}

// WaitSignals waits (Eventually) until a signal matching every filter is recorded and returns
// those recorded by then.
func (r *Recorder) WaitSignals(t testing.TB, what string, match ...func(health.Signal) bool) []health.Signal {
	t.Helper()
	var got []health.Signal
	Eventually(t, what, func() bool {
		got = r.Signals(match...)
		return len(got) > 0
	})
	return got
}

// OfKind matches signals of kind k about device uuid ("" matches every device).
func OfKind(k health.SignalKind, uuid string) func(health.Signal) bool {
	return func(s health.Signal) bool { return s.Kind == k && (uuid == "" || s.Device == uuid) }
}
