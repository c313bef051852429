package nodecondition

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// GatedBreaker is the circuit breaker (internal/breaker.Breaker) as the device-taint reporter and
// the repair condition use it: started once, asked before each escalation or repair request,
// told the GPUs it held back.
type GatedBreaker interface {
	Start(ctx context.Context, onChange func()) error
	Admit(ctx context.Context, uuid string) (bool, error)
	SetHeld(uuids []string) bool
	Held() []string
}

// BreakerGate is the one circuit breaker of an agent's device-taint reporter and repair
// condition. Both ask it about the same GPUs, and a GPU must take one slot of the budget, not
// one each: the breaker keeps a GPU with a live slot admitted, but two questions at once could
// both find no slot and take two. The gate asks one question at a time. It also tells the
// repair condition when the breaker's state changes (an acknowledgement, a slot leaving the
// window), so that a repair it held back is asked for again at once; without DRA devices the
// device-taint reporter holds nothing back and would never say so. Until the breaker has started
// (the device-taint reporter starts it, and it reads its ConfigMap first), the gate answers with
// an error: a breaker that has not read the cluster's GPU count admits everything.
type BreakerGate struct {
	breaker GatedBreaker
	// changed is called when the breaker's state changes.
	changed func()
	// started is set once the breaker has started.
	started atomic.Bool
	// admit makes one question at a time.
	admit sync.Mutex
}

// ErrBreakerNotStarted answers a question asked before the breaker has started.
var ErrBreakerNotStarted = errors.New("the circuit breaker has not read its state yet")

// NewBreakerGate returns a gate in front of b; changed, when set, is called whenever the
// breaker's state changes, besides the onChange the breaker is started with.
func NewBreakerGate(b GatedBreaker, changed func()) *BreakerGate {
	if changed == nil {
		changed = func() {}
	}
	return &BreakerGate{breaker: b, changed: changed}
}

// Start starts the breaker (the device-taint reporter starts what it is given); its changes
// call onChange and the gate's own changed, and so does its start.
func (g *BreakerGate) Start(ctx context.Context, onChange func()) error {
	if err := g.breaker.Start(ctx, func() {
		onChange()
		g.changed()
	}); err != nil {
		return err
	}
	g.started.Store(true)
	g.changed()
	return nil
}

// Admit asks the breaker whether the GPU may get a disruptive effect or ask for a repair, one
// question at a time; before the breaker has started, it answers ErrBreakerNotStarted.
func (g *BreakerGate) Admit(ctx context.Context, uuid string) (bool, error) {
	if !g.started.Load() {
		return false, ErrBreakerNotStarted
	}
	g.admit.Lock()
	defer g.admit.Unlock()
	return g.breaker.Admit(ctx, uuid)
}

// SetHeld passes the GPUs the device-taint reporter holds back on to the breaker.
func (g *BreakerGate) SetHeld(uuids []string) bool { return g.breaker.SetHeld(uuids) }

// Held returns the GPUs the device-taint reporter holds back.
func (g *BreakerGate) Held() []string { return g.breaker.Held() }

// HeldDomains are the domains whose own budgets hold back GPUs (none for a breaker without
// budgets per domain).
func (g *BreakerGate) HeldDomains() []string {
	if d, ok := g.breaker.(DomainBreaker); ok {
		return d.HeldDomains()
	}
	return nil
}

// Admitter is a Breaker the repair condition can ask itself (BreakerGate, internal/breaker's
// Breaker): whether a GPU that needs its node repaired may ask for it, taking a slot of the
// budget when it may.
type Admitter interface {
	Admit(ctx context.Context, uuid string) (bool, error)
}

var (
	_ GatedBreaker  = (*BreakerGate)(nil)
	_ Breaker       = (*BreakerGate)(nil)
	_ Admitter      = (*BreakerGate)(nil)
	_ DomainBreaker = (*BreakerGate)(nil)
)
