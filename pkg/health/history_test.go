package health_test

import (
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func historyKinds(st health.DeviceStatus) []string {
	var out []string
	for _, e := range st.History {
		out = append(out, string(e.Kind)+":"+e.Reason)
	}
	return out
}

func TestAFaultThatReturnsAfterEveryRepairEscalatesToReplaceGPU(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	h.xid(g0.UUID, 48, 0)
	h.xid(g0.UUID, 48, time.Second) // the same fault, logged again: one entry
	h.reset(g0.UUID, time.Hour)
	h.xid(g0.UUID, 64, 2*time.Hour) // back an hour after the reset: the first return
	h.wantHealth(g0.UUID, health.Unhealthy, false)
	if _, ok := h.condition(g0.UUID, health.ConditionReplaceGPU, 0); ok {
		t.Fatal("escalated after one return, want two (gpud's DefaultRebootThreshold)")
	}
	h.reboot("boot-2", 3*time.Hour)
	h.xid(g0.UUID, 48, 4*time.Hour) // back after the reboot: the second return
	c := h.mustCondition(g0.UUID, health.ConditionReplaceGPU, 0)
	if c.Severity != health.Unhealthy || c.ClearsOn != health.ClearsOnAdmin || c.RecommendedAction != health.ActionReplaceGPU ||
		c.Reason != health.ReasonFaultReturnsAfterRepair {
		t.Errorf("escalation %+v", c)
	}
	want := []string{"fault:XID48", "reset:", "fault:XID64", "reboot:", "fault:XID48"}
	if got := historyKinds(h.status(g0.UUID)); !equalStrings(got, want) {
		t.Errorf("history %q, want %q", got, want)
	}
	// A reset clears the XID but not the escalation: only an administrator does.
	h.reset(g0.UUID, 5*time.Hour)
	h.wantHealth(g0.UUID, health.Unhealthy, false)
	h.reboot("boot-3", 6*time.Hour)
	h.wantHealth(g0.UUID, health.Unhealthy, false)
	if _, cleared, err := h.tr.ClearCondition(g0.UUID, health.ConditionReplaceGPU, 0, at(7*time.Hour), nil); err != nil || !cleared {
		t.Fatalf("ClearCondition = %v, %v", cleared, err)
	}
	h.wantHealth(g0.UUID, health.Healthy, false)
	// After the clear (a new card, or one inspected), earlier returns no longer count.
	h.xid(g0.UUID, 48, 8*time.Hour)
	h.reset(g0.UUID, 9*time.Hour)
	h.xid(g0.UUID, 48, 10*time.Hour)
	if _, ok := h.condition(g0.UUID, health.ConditionReplaceGPU, 0); ok {
		t.Error("escalated again on returns from before the administrator's clear")
	}
}

func TestFaultsFarFromTheirRepairDoNotEscalate(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	d := time.Duration(0)
	for range 5 {
		h.xid(g0.UUID, 48, d)
		h.reset(g0.UUID, d+time.Minute)
		d += 2 * health.DefaultEscalationWindow // each fault days after the last repair
	}
	if _, ok := h.condition(g0.UUID, health.ConditionReplaceGPU, 0); ok {
		t.Error("faults two days apart escalated")
	}
	if n := len(h.status(g0.UUID).History); n != 10 {
		t.Errorf("history has %d entries, want 10", n)
	}
}

func TestHistoryIsBoundedAndLeavesPolledReadingsOut(t *testing.T) {
	g0 := gpuDevice(0)
	p := health.DefaultPolicy()
	p.Escalation.Enabled = false
	h := newHarness(t, p, g0)
	// An overheat is Unhealthy but recovers by itself: not a fault of the card.
	h.signal(health.SignalTemperature, g0.UUID, 0, withValue(99))
	if st := h.status(g0.UUID); len(st.History) != 0 {
		t.Fatalf("history %+v after an overheat, want none", st.History)
	}
	for i := range 100 {
		d := time.Duration(i) * time.Hour
		h.xid(g0.UUID, 48, d)
		h.reset(g0.UUID, d+time.Minute)
	}
	st := h.status(g0.UUID)
	if len(st.History) != health.MaxHistory {
		t.Fatalf("history has %d entries, want the bound %d", len(st.History), health.MaxHistory)
	}
	if last := st.History[len(st.History)-1]; last.Kind != health.HistoryReset || !last.Time.Equal(at(99*time.Hour+time.Minute)) {
		t.Errorf("newest entry %+v, want the last reset", last)
	}
}

func TestHistorySurvivesRestartAndRebootThroughTheCheckpoint(t *testing.T) {
	g0 := gpuDevice(0)
	h := newHarness(t, health.DefaultPolicy(), g0)
	h.xid(g0.UUID, 79, 0)
	h.tr.SetBootID("boot-1")
	b, err := health.MarshalCheckpoint(h.tr.Checkpoint())
	if err != nil {
		t.Fatal(err)
	}
	cp, err := health.UnmarshalCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	// A new process after a reboot: XID 79 is gone, its memory is not, and the reboot repaired it.
	n := newHarness(t, health.DefaultPolicy(), g0)
	if _, err := n.tr.Restore(cp, "boot-2", at(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	n.wantHealth(g0.UUID, health.Healthy, false)
	if got, want := historyKinds(n.status(g0.UUID)), []string{"fault:XID79", "reboot:"}; !equalStrings(got, want) {
		t.Fatalf("history after restore %q, want %q", got, want)
	}
	// Restoring the same checkpoint again in the same boot records nothing twice.
	if _, err := n.tr.Restore(cp, "boot-2", at(2*time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if got := len(n.status(g0.UUID).History); got != 2 {
		t.Errorf("history has %d entries after a second restore, want 2", got)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestValidationsInTheHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	m := health.NewMonitor(tr)
	m.Signal(health.XIDSignal("GPU-a", 48, t0))
	m.Signal(health.Signal{Kind: health.SignalReset, Device: "GPU-a", Time: t0.Add(time.Minute)})
	if err := m.RecordValidation("GPU-a", health.ValidationFailed, "dcgm: dcgmi diag", t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := m.RecordValidation("GPU-x", health.ValidationPassed, "x", t0); err == nil {
		t.Error("a validation of an unknown GPU was recorded")
	}
	snap := m.Snapshot()
	h := snap.Devices[0].History
	last, ok := health.LastValidation(h)
	if !ok || last.Reason != "failed" || last.By != "dcgm: dcgmi diag" || len(h) != 3 {
		t.Fatalf("history %+v", h)
	}
	// A GPU that failed its validation is not repaired: a reboot now repairs a pending fault,
	// and the agent after the reboot validates it (RebootRepaired).
	cp := tr.Checkpoint()
	after, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}, {UUID: "GPU-b", Index: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := after.Restore(cp, "another-boot", t0.Add(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	if got := after.RebootRepaired(); len(got) != 1 || got[0] != "GPU-a" {
		t.Errorf("RebootRepaired = %v, want [GPU-a]", got)
	}
	// The same boot: nothing was repaired by a reboot.
	same, _ := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-a", Index: 0}})
	if _, err := same.Restore(cp, cp.BootID, t0.Add(time.Hour), nil); err != nil || len(same.RebootRepaired()) != 0 {
		t.Errorf("same boot: RebootRepaired = %v (%v), want none", same.RebootRepaired(), err)
	}
}
