package nodecondition

import (
	"context"
	"testing"
)

// admitProbe is a breaker whose Admit runs probe, while the question is being asked.
type admitProbe struct {
	GatedBreaker
	probe func()
}

func (b admitProbe) Start(context.Context, func()) error         { return nil }
func (b admitProbe) Admit(context.Context, string) (bool, error) { b.probe(); return true, nil }

// TestBreakerGateAsksOneQuestionAtATime: while the breaker answers one question, the gate takes
// no other, so that the device-taint reporter and the repair condition asking about the same GPU
// at once cannot take two slots of the budget for it.
func TestBreakerGateAsksOneQuestionAtATime(t *testing.T) {
	var g *BreakerGate
	held := false
	g = NewBreakerGate(admitProbe{probe: func() {
		if g.admit.TryLock() {
			g.admit.Unlock()
			return
		}
		held = true
	}}, nil)
	if err := g.Start(context.Background(), func() {}); err != nil {
		t.Fatal(err)
	}
	if ok, err := g.Admit(context.Background(), "GPU-a"); !ok || err != nil {
		t.Fatalf("Admit = %v, %v", ok, err)
	}
	if !held {
		t.Error("the gate took another question while the breaker was answering one")
	}
	if !g.admit.TryLock() {
		t.Error("the gate still refuses questions after the answer")
	}
}
