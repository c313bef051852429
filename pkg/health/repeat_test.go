package health_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestRepeatRuleRaisesOnTheSameGPUInSeparateBursts(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	// One application crash logs XID 13 three times in a second: one burst, nothing raised.
	for i := range 3 {
		if out := h.xid(g0.UUID, 13, time.Duration(i)*100*time.Millisecond); len(out) != 0 {
			t.Fatalf("one burst of XID 13 changed health: %v", out)
		}
	}
	h.xid(g0.UUID, 13, 10*time.Minute)
	h.wantHealth(g0.UUID, health.Healthy, false)
	// The third burst within the hour: the GPU, not the application, is the likely cause.
	out := h.xid(g0.UUID, 13, 30*time.Minute)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, health.ReasonRepeatedXID13))
	c := h.mustCondition(g0.UUID, health.ConditionXIDRepeat, 1)
	if c.ClearsOn != health.ClearsOnQuietPeriod || c.RecommendedAction != health.ActionInspect || c.Message == "" {
		t.Errorf("condition %+v, want Degraded until a quiet period, inspect", c)
	}
	// Quiet for the quiet period: it clears.
	out = h.tick(30*time.Minute + health.DefaultQuietPeriod)
	wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
}

func TestRepeatRuleNeedsTheRepeatsWithinTheWindow(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	for _, d := range []time.Duration{0, 40 * time.Minute, 80 * time.Minute, 120 * time.Minute} {
		if out := h.xid(g0.UUID, 31, d); len(out) != 0 {
			t.Fatalf("XID 31 at %v (bursts 40 min apart, 3 never within an hour) changed health: %v", d, out)
		}
	}
}

func TestRepeatRuleCountsMIGInstancesOnTheirGPU(t *testing.T) {
	g0, m1, m2 := gpuDevice(0), migDevice(0, 1, 0), migDevice(0, 2, 0)
	h := newHarness(t, health.DefaultPolicy(), g0, m1, m2)
	h.observe(health.Signal{Kind: health.SignalXID, Device: g0.UUID, XID: 45, Time: at(0), MIGScoped: true, GPUInstance: 1, ComputeInstance: health.NoInstance})
	h.observe(health.Signal{Kind: health.SignalXID, Device: g0.UUID, XID: 45, Time: at(time.Minute), MIGScoped: true, GPUInstance: 2, ComputeInstance: health.NoInstance})
	h.observe(health.Signal{Kind: health.SignalXID, Device: m1.UUID, XID: 45, Time: at(2 * time.Minute)})
	h.mustCondition(g0.UUID, health.ConditionXIDRepeat, 3)
	h.wantHealth(m2.UUID, health.Degraded, false) // the GPU's condition reaches every instance
}

func TestSpreadRuleIsANodeFindingThatMakesNoGPUUnhealthy(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2), gpuDevice(3)}
	h := newHarness(t, health.DefaultPolicy(), devs...)
	h.xid(devs[0].UUID, 45, 0)
	h.xid(devs[1].UUID, 31, time.Minute)
	if f := h.tr.Snapshot().Findings; len(f) != 0 {
		t.Fatalf("findings after 2 GPUs: %+v, want none", f)
	}
	gen := h.tr.Generation()
	h.xid(devs[2].UUID, 13, 2*time.Minute)
	snap := h.tr.Snapshot()
	if len(snap.Findings) != 1 || snap.Findings[0].Reason != health.ReasonXIDSpreadOverGPU ||
		!slices.Equal(snap.Findings[0].GPUs, []string{devs[0].UUID, devs[1].UUID, devs[2].UUID}) {
		t.Fatalf("findings %+v, want one naming GPUs 0-2", snap.Findings)
	}
	if h.tr.Generation() == gen {
		t.Error("a new finding did not change the generation: publishers would not write it")
	}
	for _, d := range snap.Devices {
		if d.Health != health.Healthy {
			t.Errorf("GPU %s is %v; a spread rule changes no GPU's health", d.Device.UUID, d.Health)
		}
	}
	// The fourth GPU joins: the finding names it.
	h.xid(devs[3].UUID, 43, 3*time.Minute)
	if f := h.tr.Snapshot().Findings[0]; len(f.GPUs) != 4 {
		t.Errorf("finding %+v, want all four GPUs", f)
	}
	// Past the window with nothing new, the finding ends.
	h.tick(3*time.Minute + 10*time.Minute + time.Second)
	if f := h.tr.Snapshot().Findings; len(f) != 0 {
		t.Errorf("findings %+v after the window, want none", f)
	}
}

func TestXIDFloodRaisesOnceAndAllocatesNothing(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2), gpuDevice(3)}
	tr, err := health.NewTracker(health.DefaultPolicy(), devs)
	if err != nil {
		t.Fatal(err)
	}
	// XID 45 at 1,000/s on every GPU (NVSentinel#1712) for a minute: the same-GPU rule and the
	// spread rule each fire once, then the flood changes nothing.
	buf := make([]health.Transition, 0, 8)
	gen := uint64(0)
	i := 0
	flood := func() {
		i++
		s := health.XIDSignal(devs[i%4].UUID, 45, at(time.Duration(i)*250*time.Microsecond))
		_, _ = tr.Observe(s, buf[:0])
	}
	for range 240_000 {
		flood()
	}
	gen = tr.Generation()
	snap := tr.Snapshot()
	if len(snap.Findings) != 1 {
		t.Errorf("findings %+v, want the spread rule's", snap.Findings)
	}
	for _, d := range snap.Devices {
		if d.Health != health.Degraded {
			t.Errorf("GPU %s is %v after a minute of XID 45 bursts, want Degraded (RepeatedXID45OnSameGPU)", d.Device.UUID, d.Health)
		}
	}
	if allocs := testing.AllocsPerRun(10_000, flood); allocs != 0 {
		t.Errorf("flood: %v allocations per XID, want 0", allocs)
	}
	if tr.Generation() != gen {
		t.Errorf("generation moved from %d to %d during the steady flood: every change is an API write", gen, tr.Generation())
	}
}

func TestNonfatalXIDIsDegradedAndNeverLowersAFatalOne(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	nonfatal := func(s *health.Signal) { s.XID, s.XIDFlags = 145, health.XIDNonfatal|health.XIDHasLink }
	out := h.signal(health.SignalXID, g0.UUID, 0, nonfatal)
	wantTransitions(t, out, tr(g0.UUID, health.Healthy, health.Degraded, "XID145"))
	out = h.signal(health.SignalXID, g0.UUID, time.Second, withXID(145), func(s *health.Signal) { s.XIDFlags = health.XIDFatal })
	wantTransitions(t, out, tr(g0.UUID, health.Degraded, health.Unhealthy, "XID145"))
	if out := h.signal(health.SignalXID, g0.UUID, 2*time.Second, nonfatal); len(out) != 0 {
		t.Errorf("a Nonfatal repeat lowered a Fatal XID: %v", out)
	}
}

func TestXIDCausedByAnotherGPUsFaultIsAttributedToIt(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2)}
	h := newHarness(t, health.DefaultPolicy(), devs...)
	caused := func(s *health.Signal) { s.XID, s.XIDFlags = 145, health.XIDCausedByPrevious|health.XIDFatal }
	// The NVL72 pattern (marin#9086): one GPU logs 149, the others 145 caused by it.
	h.xid(devs[1].UUID, 149, 0)
	out := h.signal(health.SignalXID, devs[0].UUID, time.Second, caused)
	wantTransitions(t, out, tr(devs[0].UUID, health.Healthy, health.Degraded, "XID145CausedByGPU1"))
	c := h.mustCondition(devs[0].UUID, health.ConditionXID, 145)
	if c.RecommendedAction != health.ActionInspect || c.Evict {
		t.Errorf("consequential condition %+v, want inspect and no eviction", c)
	}
	h.wantHealth(devs[1].UUID, health.Unhealthy, false)
	// A consequential XID is never a root: GPU 2's caused-by XID names GPU 1, not GPU 0.
	h.signal(health.SignalXID, devs[2].UUID, 2*time.Second, caused)
	if c := h.mustCondition(devs[2].UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByGPU1" {
		t.Errorf("reason %q, want XID145CausedByGPU1", c.Reason)
	}
}

func TestXIDCausedByPreviousWithNoRootKeepsItsRule(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1)}
	h := newHarness(t, health.DefaultPolicy(), devs...)
	h.xid(devs[1].UUID, 149, 0)
	// The root's fault is older than the root-cause window: nothing to blame, fail safe.
	out := h.signal(health.SignalXID, devs[0].UUID, health.DefaultRootCauseWindow+time.Minute, withXID(145),
		func(s *health.Signal) { s.XIDFlags = health.XIDCausedByPrevious })
	wantTransitions(t, out, tr(devs[0].UUID, health.Healthy, health.Unhealthy, "XID145"))
}

func TestRepeatRuleValidate(t *testing.T) {
	ok := health.RepeatRule{Name: "R", XIDs: []uint32{13}, Count: 3, Window: time.Hour, Severity: health.Degraded}
	for _, tc := range []struct {
		name string
		mod  func(*health.RepeatRule)
	}{
		{"no name", func(r *health.RepeatRule) { r.Name = "" }},
		{"no xids", func(r *health.RepeatRule) { r.XIDs = nil }},
		{"count and gpus", func(r *health.RepeatRule) { r.GPUs = 2 }},
		{"neither", func(r *health.RepeatRule) { r.Count = 0 }},
		{"count one", func(r *health.RepeatRule) { r.Count = 1 }},
		{"count huge", func(r *health.RepeatRule) { r.Count = health.MaxRepeatCount + 1 }},
		{"no window", func(r *health.RepeatRule) { r.Window = 0 }},
		{"burst as long as the window", func(r *health.RepeatRule) { r.Burst = time.Hour }},
		{"healthy", func(r *health.RepeatRule) { r.Severity = health.Healthy }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			if err := r.Validate(); err == nil {
				t.Errorf("Validate(%+v) = nil, want an error", r)
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(valid) = %v", err)
	}
	for _, r := range health.DefaultRepeatRules() {
		if err := r.Validate(); err != nil {
			t.Errorf("default rule %s: %v", r.Name, err)
		}
	}
}

func TestAnXIDCausedByAnEarlierOneCountsTowardsNoRepeatRule(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	// XID 45 "caused by previous Xid 149" (drivers 570.124.04+), once a minute for an hour.
	for i := range 60 {
		h.signal(health.SignalXID, g0.UUID, time.Duration(i)*time.Minute, withXID(45), func(s *health.Signal) {
			s.XIDFlags, s.CauseXID = health.XIDCausedByPrevious, 149
		})
	}
	h.wantHealth(g0.UUID, health.Healthy, false)
}

func TestTheRootIsTheGPUWithTheXIDTheDriverNamed(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2)}
	h := newHarness(t, health.DefaultPolicy(), devs...)
	h.xid(devs[1].UUID, 149, 0)
	h.xid(devs[2].UUID, 48, time.Second) // more recent, but not the XID named
	h.signal(health.SignalXID, devs[0].UUID, 2*time.Second, withXID(145), func(s *health.Signal) {
		s.XIDFlags, s.CauseXID = health.XIDCausedByPrevious, 149
	})
	if c := h.mustCondition(devs[0].UUID, health.ConditionXID, 145); c.Reason != "XID145CausedByGPU1" {
		t.Errorf("reason %q, want the GPU with XID 149 (XID145CausedByGPU1)", c.Reason)
	}
}

// expireFindings skips its work until a finding can end; whatever signal comes first after
// that must still end it, a clock that jumped back included.
func TestSpreadFindingEndsOnTheFirstSignalPastItsWindow(t *testing.T) {
	devs := []health.Device{gpuDevice(0), gpuDevice(1), gpuDevice(2), gpuDevice(3)}
	const window = 10 * time.Minute // the default spread rule's
	raise := func(h *harness, from time.Duration) {
		t.Helper()
		for i := range 3 {
			h.xid(devs[i].UUID, 13, from+time.Duration(i)*time.Second)
		}
		if f := h.tr.Snapshot().Findings; len(f) != 1 {
			t.Fatalf("findings %+v, want the spread rule's", f)
		}
	}
	t.Run("a sample on another GPU", func(t *testing.T) {
		h := newHarness(t, health.DefaultPolicy(), devs...)
		raise(h, 0)
		h.signal(health.SignalSample, devs[3].UUID, 2*time.Second+window)
		if f := h.tr.Snapshot().Findings; len(f) != 1 {
			t.Fatalf("findings %+v at the window's end, want it kept", f)
		}
		gen := h.tr.Generation()
		h.signal(health.SignalSample, devs[3].UUID, 2*time.Second+window+time.Millisecond)
		if f := h.tr.Snapshot().Findings; len(f) != 0 {
			t.Errorf("findings %+v past the window, want none", f)
		}
		if h.tr.Generation() == gen {
			t.Error("the finding ended without a new generation: publishers would keep it")
		}
	})
	t.Run("seen again after the clock jumped back", func(t *testing.T) {
		h := newHarness(t, health.DefaultPolicy(), devs...)
		raise(h, time.Hour)
		// The clock steps back half an hour and the XIDs go on: the finding is seen at the
		// earlier time, so its window ends earlier than it did.
		raise(h, 30*time.Minute)
		h.signal(health.SignalSample, devs[3].UUID, 30*time.Minute+2*time.Second+window+time.Millisecond)
		if f := h.tr.Snapshot().Findings; len(f) != 0 {
			t.Errorf("findings %+v past the window of its last sighting, want none", f)
		}
	})
	t.Run("kept alive by the flood", func(t *testing.T) {
		h := newHarness(t, health.DefaultPolicy(), devs...)
		raise(h, 0)
		for m := time.Duration(1); m <= 30; m++ {
			h.xid(devs[int(m)%3].UUID, 13, m*time.Minute)
		}
		if f := h.tr.Snapshot().Findings; len(f) != 1 || f[0].Since != at(2*time.Second) {
			t.Fatalf("findings %+v during the flood, want the one raised first", f)
		}
		h.tick(30*time.Minute + window + time.Second)
		if f := h.tr.Snapshot().Findings; len(f) != 0 {
			t.Errorf("findings %+v after the flood's window, want none", f)
		}
	})
}
