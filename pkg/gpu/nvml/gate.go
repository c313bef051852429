package nvml

import (
	"context"
	"sync"
)

// gateState is where NVML stands between the loops of Run and a reset.
type gateState int

const (
	// gateOpen: NVML is initialised and the loops may call it.
	gateOpen gateState = iota
	// gateDraining: a reset asked for NVML; loops finish their call, free the event set and wait.
	gateDraining
	// gateClosed: the reset has NVML (shut down while its command runs).
	gateClosed
	// gateDown: Init failed after a reset; Run's keeper tries again with backoff.
	gateDown
)

// gate lets a reset take NVML away from the loops of Run and give it back. The loops call NVML
// only between enter and leave; the event loop also counts its event set (setMade, setFreed).
// A reset drains the gate (no call in flight, no event set left) before it shuts NVML down, and
// opens it again once NVML is initialised and the handles are fresh. epoch counts those
// re-initialisations: the event loop makes its set anew when it changed.
type gate struct {
	mu sync.Mutex
	// changed is closed, and replaced, at every change of state or count: it wakes waiters.
	changed chan struct{}
	state   gateState
	users   int
	sets    int
	// parked counts the loops waiting in park for the gate to open.
	parked int
	epoch  uint64
	// downErr is why Init failed, while the state is gateDown.
	downErr error
}

func newGate() *gate { return &gate{changed: make(chan struct{})} }

// notify wakes every waiter. g.mu must be held.
func (g *gate) notify() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// tryEnter counts a user and returns the epoch when the gate is open; else it returns false and
// a channel closed at the next change.
func (g *gate) tryEnter() (epoch uint64, wake <-chan struct{}, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != gateOpen {
		return 0, g.changed, false
	}
	g.users++
	return g.epoch, nil, true
}

// enter waits until the gate is open and counts a user. It returns false when ctx ended first.
func (g *gate) enter(ctx context.Context) (epoch uint64, ok bool) {
	for {
		epoch, wake, ok := g.tryEnter()
		if ok {
			return epoch, true
		}
		if !g.park(ctx, wake) {
			return 0, false
		}
	}
}

// park waits for wake (from tryEnter) and counts the loop as parked meanwhile. It returns false
// when ctx ended first.
func (g *gate) park(ctx context.Context, wake <-chan struct{}) bool {
	g.mu.Lock()
	g.parked++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.parked--
		g.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		return false
	case <-wake:
		return true
	}
}

// parkedLoops returns how many loops wait for the gate to open.
func (g *gate) parkedLoops() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.parked
}

// leave ends a user's calls.
func (g *gate) leave() { g.release(&g.users) }

// release counts down n, one of what drain waits for (users, event sets): a drain in progress
// looks again.
func (g *gate) release(n *int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	*n--
	if g.state == gateDraining {
		g.notify()
	}
}

// setMade and setFreed count the event sets alive.
func (g *gate) setMade() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sets++
}

func (g *gate) setFreed() { g.release(&g.sets) }

// wake returns a channel closed at the next change, and whether a reset wants NVML now (the
// gate is not open): a loop that sleeps wakes on it to let go of its event set.
func (g *gate) wake() (<-chan struct{}, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.changed, g.state != gateOpen
}

// drain takes NVML for a reset: it waits until no call is in flight and every event set is
// freed. It reports whether NVML is still initialised (false when it is down after an earlier
// failed Init: there is nothing to shut down). When ctx ends first the gate opens again.
func (g *gate) drain(ctx context.Context) (initialised bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case gateDown:
		g.state = gateClosed
		g.notify()
		return false, nil
	case gateOpen:
		g.state = gateDraining
		g.notify()
	}
	for g.users > 0 || g.sets > 0 {
		wake := g.changed
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			g.mu.Lock()
			g.state = gateOpen
			g.notify()
			return false, ctx.Err()
		case <-wake:
		}
		g.mu.Lock()
	}
	g.state = gateClosed
	g.notify()
	return true, nil
}

// reopen opens the gate after NVML was initialised again: a new epoch.
func (g *gate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state, g.downErr = gateOpen, nil
	g.epoch++
	g.notify()
}

// resume opens the gate on the same NVML session, after a reset that did not shut it down.
func (g *gate) resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state = gateOpen
	g.notify()
}

// down records that NVML could not be initialised again.
func (g *gate) down(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.state, g.downErr = gateDown, err
	g.notify()
}

// downState returns a channel closed at the next change and why NVML is down (nil when it is
// not).
func (g *gate) downState() (<-chan struct{}, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != gateDown {
		return g.changed, nil
	}
	return g.changed, g.downErr
}
