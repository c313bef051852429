package health

import (
	"context"
	"sync"
	"time"
)

// MaxPendingTransitions bounds the transitions a Subscription holds for a consumer that has not
// caught up; past it the oldest are dropped and counted, and the snapshot stays exact.
const MaxPendingTransitions = 4096

// Monitor connects a backend to a Tracker and to any number of subscribers. Backends call
// Signal, Reboot, SetUnmonitored and SetCheckUnmonitored (they take it as a gpu.Sink, with
// SetCheckUnmonitored as a capability); subscribers receive the latest Snapshot and the transitions since they last
// looked. A slow subscriber never blocks the backend: snapshots coalesce to the latest one.
type Monitor struct {
	tracker *Tracker

	// feed serialises the backend-facing methods, so transitions reach subscribers in order.
	feed sync.Mutex
	buf  []Transition
	// published is the tracker generation of the last published snapshot.
	published uint64

	mu   sync.Mutex
	subs map[*Subscription]struct{}
	last Snapshot

	// cursorMoved holds a token once Advance moved a cursor; a Runtime takes it and saves.
	cursorMoved chan struct{}
}

// NewMonitor returns a Monitor feeding t.
func NewMonitor(t *Tracker) *Monitor {
	m := &Monitor{tracker: t, subs: map[*Subscription]struct{}{}, cursorMoved: make(chan struct{}, 1)}
	m.last = t.Snapshot()
	m.published = t.Generation()
	return m
}

// Tracker returns the monitor's tracker.
func (m *Monitor) Tracker() *Tracker { return m.tracker }

// Signal applies one signal. Signals about unknown devices are dropped: a backend only reports
// devices of its own inventory.
func (m *Monitor) Signal(s Signal) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf, _ = m.tracker.Observe(s, m.buf[:0])
	m.publishLocked()
}

// Reboot applies a node reboot (simulated backends report one; a real node restarts the agent).
func (m *Monitor) Reboot(bootID string, at time.Time) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf = m.tracker.Reboot(bootID, at, m.buf[:0])
	m.publishLocked()
}

// SetUnmonitored marks a device the backend cannot watch.
func (m *Monitor) SetUnmonitored(uuid string, unmonitored bool) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf = m.buf[:0]
	if m.tracker.SetUnmonitored(uuid, unmonitored) == nil {
		m.publishLocked()
	}
}

// SetCheckUnmonitored marks one check the backend cannot run on a device (see
// Tracker.SetCheckUnmonitored).
func (m *Monitor) SetCheckUnmonitored(uuid string, check Check, unmonitored bool) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf = m.buf[:0]
	if m.tracker.SetCheckUnmonitored(uuid, check, unmonitored) == nil {
		m.publishLocked()
	}
}

// SetDrains applies the complete set of administrative drains (see Tracker.SetDrains) and
// returns the UUIDs it does not know.
func (m *Monitor) SetDrains(drained map[string]string, now time.Time) []string {
	m.feed.Lock()
	defer m.feed.Unlock()
	var unknown []string
	m.buf, unknown = m.tracker.SetDrains(drained, now, m.buf[:0])
	m.publishLocked()
	return unknown
}

// SetPeerFaults applies the complete set of the peer nodes' faults (see Tracker.SetPeerFaults)
// and publishes the result; it returns the invalid faults it dropped, as errors.
func (m *Monitor) SetPeerFaults(faults []PeerFault, now time.Time) error {
	m.feed.Lock()
	defer m.feed.Unlock()
	var err error
	m.buf, err = m.tracker.SetPeerFaults(faults, now, m.buf[:0])
	m.publishLocked()
	return err
}

// ClearCondition ends a condition by hand (see Tracker.ClearCondition: an administrator's
// decision; a zero condType clears every condition of the device) and publishes the result, its
// transitions included. It reports whether anything cleared.
func (m *Monitor) ClearCondition(uuid string, condType ConditionType, code uint32, now time.Time) (bool, error) {
	m.feed.Lock()
	defer m.feed.Unlock()
	var cleared bool
	var err error
	m.buf, cleared, err = m.tracker.ClearCondition(uuid, condType, code, now, m.buf[:0])
	m.publishLocked()
	return cleared, err
}

// RecordValidation records a validation verdict in a GPU's history and publishes it.
func (m *Monitor) RecordValidation(uuid string, result ValidationResult, by string, at time.Time) error {
	m.feed.Lock()
	defer m.feed.Unlock()
	err := m.tracker.RecordValidation(uuid, result, by, at)
	m.publishLocked()
	return err
}

// Tick expires quiet periods as of now; call it periodically.
func (m *Monitor) Tick(now time.Time) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf = m.tracker.Tick(now, m.buf[:0])
	m.publishLocked()
}

// Restore loads a checkpoint into the tracker and publishes the result.
func (m *Monitor) Restore(cp Checkpoint, bootID string, now time.Time) error {
	m.feed.Lock()
	defer m.feed.Unlock()
	var err error
	m.buf, err = m.tracker.Restore(cp, bootID, now, m.buf[:0])
	m.publishLocked()
	return err
}

// publishLocked hands a new snapshot and the buffered transitions to every subscriber when
// anything changed. Storms of identical signals change nothing and cost nothing here.
func (m *Monitor) publishLocked() {
	gen := m.tracker.Generation()
	if gen == m.published && len(m.buf) == 0 {
		return
	}
	m.published = gen
	snap := m.tracker.Snapshot()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.last = snap
	for sub := range m.subs {
		sub.offer(snap, m.buf)
	}
}

// Snapshot returns the latest published snapshot.
func (m *Monitor) Snapshot() Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// Subscribe registers a subscriber. It starts with the current snapshot pending, so a new
// subscriber always sees the state once. Call Close when done.
func (m *Monitor) Subscribe() *Subscription {
	sub := &Subscription{monitor: m, notify: make(chan struct{}, 1)}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.subs[sub] = struct{}{}
	sub.offer(m.last, nil)
	return sub
}

// Subscription is one consumer's view of a Monitor.
type Subscription struct {
	monitor *Monitor
	// notify holds one token when something is pending; the Monitor never blocks on it.
	notify chan struct{}

	mu          sync.Mutex
	snapshot    Snapshot
	hasSnapshot bool
	transitions []Transition
	dropped     int
}

func (s *Subscription) offer(snap Snapshot, ts []Transition) {
	s.mu.Lock()
	s.snapshot, s.hasSnapshot = snap, true
	s.transitions = append(s.transitions, ts...)
	if over := len(s.transitions) - MaxPendingTransitions; over > 0 {
		s.transitions = append(s.transitions[:0], s.transitions[over:]...)
		s.dropped += over
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// C is ready whenever an update is pending; then call Next.
func (s *Subscription) C() <-chan struct{} { return s.notify }

// Update is what a subscriber receives: the latest snapshot, the transitions since the last
// update in order, and how many transitions were dropped because the subscriber fell behind.
type Update struct {
	Snapshot    Snapshot
	Transitions []Transition
	Dropped     int
}

// Next takes the pending update; ok is false when nothing is pending.
func (s *Subscription) Next() (u Update, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.hasSnapshot {
		return Update{}, false
	}
	u = Update{Snapshot: s.snapshot, Transitions: s.transitions, Dropped: s.dropped}
	s.hasSnapshot, s.transitions, s.dropped = false, nil, 0
	return u, true
}

// Wait blocks until an update is pending and takes it; ok is false once ctx is done.
func (s *Subscription) Wait(ctx context.Context) (u Update, ok bool) {
	for {
		select {
		case <-ctx.Done():
			return Update{}, false
		case <-s.notify:
		}
		if u, ok := s.Next(); ok {
			return u, true
		}
	}
}

// Close unregisters the subscription.
func (s *Subscription) Close() {
	s.monitor.mu.Lock()
	defer s.monitor.mu.Unlock()
	delete(s.monitor.subs, s)
}
