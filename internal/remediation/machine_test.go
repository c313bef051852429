package remediation

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

type fakeEnv struct {
	asked      int
	holders    map[string][]string
	holdersErr error
	budget     int
	slots      []string
	takeErr    error
	resets     []string
	migsSeen   map[string][]health.Device
}

func newEnv() *fakeEnv {
	return &fakeEnv{holders: map[string][]string{}, budget: 1, migsSeen: map[string][]health.Device{}}
}

func (e *fakeEnv) Holders(_ context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	e.migsSeen[dev.UUID] = migs
	e.asked++
	return e.holders[dev.UUID], e.holdersErr
}

func (e *fakeEnv) TakeSlot(_ context.Context, uuid string) (bool, error) {
	if e.takeErr != nil {
		return false, e.takeErr
	}
	if slices.Contains(e.slots, uuid) {
		return true, nil
	}
	if len(e.slots) >= e.budget {
		return false, nil
	}
	e.slots = append(e.slots, uuid)
	return true, nil
}

func (e *fakeEnv) ReleaseSlot(_ context.Context, uuid string) error {
	e.slots = slices.DeleteFunc(e.slots, func(s string) bool { return s == uuid })
	return nil
}

func (e *fakeEnv) StartReset(dev health.Device) { e.resets = append(e.resets, dev.UUID) }

func gpu(i int) health.Device { return health.Device{UUID: "GPU-" + string(rune('a'+i)), Index: i} }

// xid48 is a double-bit ECC error: Unhealthy until a GPU reset.
var xid48 = health.Condition{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, Reason: "XID48", ClearsOn: health.ClearsOnGPUReset, RecommendedAction: health.ActionResetGPU}

// xid79 is a GPU that fell off the bus: only a reboot helps.
var xid79 = health.Condition{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", ClearsOn: health.ClearsOnNodeReboot, RecommendedAction: health.ActionRebootNode}

var drain = health.Condition{Type: health.ConditionAdmin, Severity: health.Unhealthy, Reason: health.ReasonAdminDrain, ClearsOn: health.ClearsOnAdmin}

func status(dev health.Device, conds ...health.Condition) health.DeviceStatus {
	d := health.DeviceStatus{Device: dev, Conditions: conds}
	for _, c := range conds {
		d.Health = max(d.Health, c.Severity)
	}
	return d
}

// snap is a snapshot taken now (the rig's clock is set by newRig; snapshots in these tests are
// always current unless a test says otherwise).
func snap(ds ...health.DeviceStatus) health.Snapshot {
	return health.Snapshot{Time: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), Devices: ds}
}

type rig struct {
	t     *testing.T
	clock *testingclock.FakeClock
	env   *fakeEnv
	m     *Machine
	log   []Event
}

func newRig(t *testing.T, cfg Config) *rig {
	if cfg.MaxAttempts == 0 {
		cfg = Config{MaxAttempts: 3, Probation: time.Minute, Window: time.Hour, ResetTimeout: 30 * time.Second, EvictAfter: cfg.EvictAfter}
	}
	clk := testingclock.NewFakeClock(t0)
	env := newEnv()
	return &rig{t: t, clock: clk, env: env, m: NewMachine(cfg, clk, env)}
}

func (r *rig) step(s health.Snapshot) []Event {
	ev := r.m.Step(context.Background(), s)
	r.log = append(r.log, ev...)
	return ev
}

func (r *rig) phase(i int) Phase { return r.m.States()[gpu(i).UUID].Phase }

func (r *rig) wantPhase(i int, want Phase) {
	r.t.Helper()
	if got := r.phase(i); got != want {
		r.t.Fatalf("GPU %d in phase %q, want %q (%+v)\nevents: %v", i, got, want, r.m.States()[gpu(i).UUID], kinds(r.log))
	}
}

func kinds(evs []Event) []EventKind {
	var out []EventKind
	for _, e := range evs {
		out = append(out, e.Kind)
	}
	return out
}

// reset completes the reset the machine started on GPU i: the command succeeds and the
// backend reports the reset.
func (r *rig) reset(i int) {
	r.m.ResetFinished(gpu(i).UUID, nil)
	r.m.ResetObserved(gpu(i).UUID, r.clock.Now())
}

func TestHealthyAndNonResettableGPUsAreLeftAlone(t *testing.T) {
	cases := []struct {
		name string
		d    health.DeviceStatus
	}{
		{"healthy", status(gpu(0))},
		{"fell off the bus (reboot)", status(gpu(0), xid79)},
		{"reset and reboot faults together", status(gpu(0), xid48, xid79)},
		{"degraded only", status(gpu(0), health.Condition{Type: health.ConditionRowRemapPending, Severity: health.Degraded, Reason: "RowRemapPending", ClearsOn: health.ClearsOnGPUReset})},
		{"drained only", status(gpu(0), drain)},
		{"clears on reset but asks for a hardware check", status(gpu(0), health.Condition{Type: health.ConditionXID, Code: 54, Severity: health.Unhealthy,
			Reason: "XID54", ClearsOn: health.ClearsOnGPUReset, RecommendedAction: health.ActionCheckHardware})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{})
			if ev := r.step(snap(tc.d)); len(ev) != 0 {
				t.Errorf("events %v", kinds(ev))
			}
			if len(r.m.States()) != 0 || len(r.env.resets) != 0 {
				t.Errorf("states %v, resets %v", r.m.States(), r.env.resets)
			}
		})
	}
}

func TestIdleGPURepairedThroughProbation(t *testing.T) {
	r := newRig(t, Config{})
	sick, well := snap(status(gpu(0), xid48), status(gpu(1))), snap(status(gpu(0)), status(gpu(1)))
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	if !slices.Equal(r.env.resets, []string{gpu(0).UUID}) || !slices.Equal(r.env.slots, []string{gpu(0).UUID}) {
		t.Fatalf("resets %v, slots %v", r.env.resets, r.env.slots)
	}
	r.clock.Step(2 * time.Second)
	r.step(sick) // the command is still running
	r.wantPhase(0, PhaseResetting)
	r.reset(0)
	r.clock.Step(time.Second)
	r.step(well)
	r.wantPhase(0, PhaseProbation)
	// On probation the reporters still see the GPU Unhealthy.
	dec := Decorate(well, r.m.States())
	if dec.Devices[0].Health != health.Unhealthy || dec.Devices[0].Conditions[0].Reason != ReasonProbation || dec.Devices[1].Health != health.Healthy {
		t.Fatalf("decorated %+v", dec.Devices)
	}
	if well.Devices[0].Health != health.Healthy || len(well.Devices[0].Conditions) != 0 {
		t.Fatal("Decorate changed its input")
	}
	r.clock.Step(59 * time.Second)
	r.step(well)
	r.wantPhase(0, PhaseProbation)
	r.clock.Step(time.Second)
	ev := r.step(well)
	r.wantPhase(0, PhaseIdle)
	if len(ev) != 1 || ev[0].Kind != KindRepaired || ev[0].Duration != 63*time.Second {
		t.Fatalf("events %+v", ev)
	}
	if len(r.env.slots) != 0 {
		t.Errorf("slot not released: %v", r.env.slots)
	}
	if got := Decorate(well, r.m.States()); got.Devices[0].Health != health.Healthy {
		t.Errorf("repaired GPU still decorated: %+v", got.Devices[0])
	}
	want := []EventKind{KindStarted, KindResetStarted, KindResetObserved, KindRepaired}
	if !slices.Equal(kinds(r.log), want) {
		t.Errorf("events %v, want %v", kinds(r.log), want)
	}
}

func TestNoResetWhileAPodHoldsTheGPU(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	r.env.holders[gpu(0).UUID] = []string{"ml/train-0"}
	for range 10 {
		r.step(sick)
		r.clock.Step(time.Minute)
	}
	r.wantPhase(0, PhaseWaitingForPods)
	if len(r.env.resets) != 0 || len(r.env.slots) != 0 {
		t.Fatalf("reset %v with slot %v while held", r.env.resets, r.env.slots)
	}
	waiting := 0
	for _, k := range kinds(r.log) {
		if k == KindWaiting {
			waiting++
		}
	}
	if waiting != 1 {
		t.Errorf("want one Waiting event for an unchanged holder, got %v", kinds(r.log))
	}
	if st := r.m.States()[gpu(0).UUID]; st.Evict || !strings.Contains(st.Message, "ml/train-0") {
		t.Errorf("state %+v", st)
	}
	delete(r.env.holders, gpu(0).UUID)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
}

func TestUnknownHoldersNeverReset(t *testing.T) {
	r := newRig(t, Config{})
	r.env.holdersErr = errors.New("kubelet socket: connection refused")
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseWaitingForPods)
	if len(r.env.resets) != 0 || !strings.Contains(r.m.States()[gpu(0).UUID].Message, "connection refused") {
		t.Fatalf("resets %v, state %+v", r.env.resets, r.m.States())
	}
}

func TestEvictionAfterTheGracePeriod(t *testing.T) {
	r := newRig(t, Config{EvictAfter: 2 * time.Minute})
	sick := snap(status(gpu(0), xid48))
	r.env.holders[gpu(0).UUID] = []string{"ml/train-0"}
	r.step(sick)
	r.clock.Step(119 * time.Second)
	r.step(sick)
	if Decorate(sick, r.m.States()).Devices[0].Evict {
		t.Fatal("evicting before the grace period")
	}
	r.clock.Step(time.Second)
	ev := r.step(sick)
	if len(ev) != 1 || ev[0].Kind != KindEvicting || !Decorate(sick, r.m.States()).Devices[0].Evict {
		t.Fatalf("events %v, decorated %+v", kinds(ev), Decorate(sick, r.m.States()).Devices[0])
	}
	delete(r.env.holders, gpu(0).UUID)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	if Decorate(sick, r.m.States()).Devices[0].Evict {
		t.Error("still asking for eviction once the pods are gone")
	}
}

func TestBudgetSerialisesRepairs(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48), status(gpu(1), xid48), status(gpu(2), xid48))
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	r.wantPhase(1, PhaseWaitingForSlot)
	r.wantPhase(2, PhaseWaitingForSlot)
	r.reset(0)
	r.step(snap(status(gpu(0)), status(gpu(1), xid48), status(gpu(2), xid48)))
	r.wantPhase(0, PhaseProbation)
	r.wantPhase(1, PhaseWaitingForSlot)
	r.clock.Step(time.Minute)
	r.step(snap(status(gpu(0)), status(gpu(1), xid48), status(gpu(2), xid48)))
	r.wantPhase(0, PhaseIdle)
	r.wantPhase(1, PhaseResetting)
	r.wantPhase(2, PhaseWaitingForSlot)
	if !slices.Equal(r.env.resets, []string{gpu(0).UUID, gpu(1).UUID}) {
		t.Fatalf("resets %v", r.env.resets)
	}
}

func TestSlotErrorsWait(t *testing.T) {
	r := newRig(t, Config{})
	r.env.takeErr = errors.New("forbidden")
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseWaitingForSlot)
	if len(r.env.resets) != 0 || !strings.Contains(r.m.States()[gpu(0).UUID].Message, "forbidden") {
		t.Fatalf("resets %v, %+v", r.env.resets, r.m.States())
	}
}

func TestAdminDrainBlocksRemediation(t *testing.T) {
	r := newRig(t, Config{})
	r.env.holders[gpu(0).UUID] = []string{"a/b"}
	r.step(snap(status(gpu(0), xid48)))
	r.step(snap(status(gpu(0), xid48, drain)))
	r.wantPhase(0, PhaseBlocked)
	delete(r.env.holders, gpu(0).UUID)
	for range 3 {
		r.clock.Step(time.Hour)
		r.step(snap(status(gpu(0), xid48, drain)))
	}
	if len(r.env.resets) != 0 {
		t.Fatal("reset a drained GPU")
	}
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseResetting)
}

func TestFailedResetsEndInRemediationFailed(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	for attempt := 1; attempt <= 3; attempt++ {
		r.step(sick)
		r.wantPhase(0, PhaseResetting)
		r.m.ResetFinished(gpu(0).UUID, errors.New("exit status 255: In use by another client"))
		r.clock.Step(time.Second)
		r.step(sick)
		if len(r.env.slots) != 0 {
			t.Fatalf("attempt %d: slot kept after failure", attempt)
		}
		r.clock.Step(r.m.retryDelay(attempt))
	}
	r.wantPhase(0, PhaseFailed)
	st := r.m.States()[gpu(0).UUID]
	if len(r.env.resets) != 3 || !strings.Contains(st.Message, "In use by another client") {
		t.Fatalf("resets %v, state %+v", r.env.resets, st)
	}
	d := Decorate(sick, r.m.States()).Devices[0]
	last := d.Conditions[len(d.Conditions)-1]
	if last.Reason != ReasonRemediationFailed || last.RecommendedAction != health.ActionRebootNode || d.Health != health.Unhealthy {
		t.Fatalf("decorated %+v", d)
	}
	for range 5 {
		r.clock.Step(10 * time.Minute)
		r.step(sick)
	}
	if len(r.env.resets) != 3 {
		t.Fatalf("kept resetting after giving up: %v", r.env.resets)
	}
	// Someone resets the GPU by hand (or the node reboots): remediation lets go.
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseIdle)
	if _, kept := r.m.States()[gpu(0).UUID]; kept {
		t.Error("state kept after recovery")
	}
}

func TestResetNotObservedTimesOut(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	r.step(sick)
	r.m.ResetFinished(gpu(0).UUID, nil) // the command says yes, the backend never sees it
	r.clock.Step(29 * time.Second)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	r.clock.Step(time.Second)
	ev := r.step(sick)
	if len(ev) == 0 || ev[0].Kind != KindAttemptFailed || !strings.Contains(ev[0].Message, "did not report the reset") {
		t.Fatalf("events %+v", ev)
	}
}

func TestStaleResetSignalDoesNotCount(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	r.m.ResetObserved(gpu(0).UUID, t0.Add(-time.Minute))
	r.step(sick)
	r.m.ResetFinished(gpu(0).UUID, nil)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
}

func TestFaultReturningAfterEachResetEndsInRemediationFailed(t *testing.T) {
	r := newRig(t, Config{})
	sick, well := snap(status(gpu(0), xid48)), snap(status(gpu(0)))
	for attempt := 1; attempt <= 3; attempt++ {
		r.step(sick)
		r.wantPhase(0, PhaseResetting)
		r.reset(0)
		r.step(well)
		r.wantPhase(0, PhaseProbation)
		r.clock.Step(20 * time.Second)
		r.step(sick)
		r.clock.Step(r.m.retryDelay(attempt))
	}
	r.wantPhase(0, PhaseFailed)
	want := []EventKind{KindStarted}
	for range 3 {
		want = append(want, KindResetStarted, KindResetObserved, KindAttemptFailed)
	}
	want = append(want, KindGaveUp)
	if !slices.Equal(kinds(r.log), want) {
		t.Fatalf("events %v, want %v", kinds(r.log), want)
	}
}

func TestFaultAgainWithinTheWindowCounts(t *testing.T) {
	r := newRig(t, Config{})
	sick, well := snap(status(gpu(0), xid48)), snap(status(gpu(0)))
	repair := func() {
		r.step(sick)
		r.wantPhase(0, PhaseResetting)
		r.reset(0)
		r.step(well)
		r.clock.Step(time.Minute)
		r.step(well)
		r.wantPhase(0, PhaseIdle)
	}
	for range 3 {
		repair()
		r.clock.Step(5 * time.Minute)
	}
	if n := len(r.m.States()[gpu(0).UUID].Attempts); n != 3 {
		t.Fatalf("%d attempts counted, want 3", n)
	}
	r.step(sick)
	r.wantPhase(0, PhaseFailed)
	// Outside the window the GPU starts afresh.
	r.step(well)
	r.clock.Step(time.Hour)
	repair()
	if n := len(r.m.States()[gpu(0).UUID].Attempts); n != 1 {
		t.Fatalf("%d attempts after the window, want 1", n)
	}
	r.clock.Step(time.Hour)
	r.step(well)
	if len(r.m.States()) != 0 {
		t.Errorf("state kept after the window: %v", r.m.States())
	}
}

func TestFaultClearingWhileWaitingCancels(t *testing.T) {
	r := newRig(t, Config{})
	r.env.holders[gpu(0).UUID] = []string{"a/b"}
	r.step(snap(status(gpu(0), xid48)))
	ev := r.step(snap(status(gpu(0))))
	if len(ev) != 1 || ev[0].Kind != KindCancelled || len(r.m.States()) != 0 {
		t.Fatalf("events %v, states %v", kinds(ev), r.m.States())
	}
}

func TestRestartDuringTheReset(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after health.DeviceStatus
		want  Phase
	}{
		{"the checkpoint saw the reset: probation", status(gpu(0)), PhaseProbation},
		{"the fault is still there: the attempt failed", status(gpu(0), xid48), PhaseWaitingForPods},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{})
			r.env.holders[gpu(0).UUID] = nil
			r.step(snap(status(gpu(0), xid48)))
			r.wantPhase(0, PhaseResetting)
			saved := r.m.States()

			r2 := newRig(t, Config{})
			r2.env.slots = slices.Clone(r.env.slots)
			r2.env.holders[gpu(0).UUID] = []string{"x/y"} // keeps a retry from going on to reset
			r2.m.Restore(saved)
			r2.step(snap(tc.after))
			r2.wantPhase(0, tc.want)
			if got := len(r2.m.States()[gpu(0).UUID].Attempts); got != 1 {
				t.Errorf("%d attempts, want the interrupted one counted", got)
			}
			if len(r2.env.resets) != 0 {
				t.Errorf("reset again at once: %v", r2.env.resets)
			}
			holds := slices.Contains(r2.env.slots, gpu(0).UUID)
			if holds != (tc.want == PhaseProbation) {
				t.Errorf("slot held %v in phase %s", holds, tc.want)
			}
		})
	}
}

func TestRestoredProbationResumes(t *testing.T) {
	r := newRig(t, Config{})
	r.m.Restore(map[string]State{gpu(0).UUID: {Phase: PhaseProbation, Since: t0.Add(-50 * time.Second), FaultSince: t0.Add(-2 * time.Minute), Attempts: []time.Time{t0.Add(-time.Minute)}}})
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseProbation)
	r.clock.Step(10 * time.Second)
	ev := r.step(snap(status(gpu(0))))
	if len(ev) != 1 || ev[0].Kind != KindRepaired || ev[0].Duration != 2*time.Minute+10*time.Second {
		t.Fatalf("events %+v", ev)
	}
}

func TestMIGInstancesFollowTheirGPU(t *testing.T) {
	r := newRig(t, Config{})
	parent := gpu(0)
	mig := health.Device{UUID: "MIG-1", Index: 0, MIG: &health.MIGPlacement{ParentUUID: parent.UUID, GPUInstance: 1}}
	s := snap(status(parent, xid48), status(mig, xid48))
	r.env.holders[parent.UUID] = []string{"a/b"}
	r.step(s)
	if got := r.env.migsSeen[parent.UUID]; len(got) != 1 || got[0].UUID != "MIG-1" {
		t.Fatalf("holders asked with MIG instances %v", got)
	}
	if _, tracked := r.m.States()["MIG-1"]; tracked {
		t.Fatal("a MIG instance is remediated on its own")
	}
	delete(r.env.holders, parent.UUID)
	r.step(s)
	r.reset(0)
	well := snap(status(parent), status(mig))
	r.step(well)
	r.wantPhase(0, PhaseProbation)
	if d := Decorate(well, r.m.States()).Devices[1]; d.Health != health.Unhealthy {
		t.Errorf("MIG instance of a GPU on probation is %v", d.Health)
	}
}

func TestGPUGoneFromTheInventoryIsForgotten(t *testing.T) {
	r := newRig(t, Config{})
	r.step(snap(status(gpu(0), xid48)))
	r.step(snap(status(gpu(1))))
	if len(r.m.States()) != 0 || len(r.env.slots) != 0 {
		t.Fatalf("states %v, slots %v", r.m.States(), r.env.slots)
	}
}

func TestSnapshotOlderThanTheResetIsNotAReturningFault(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	r.step(sick)
	r.clock.Step(time.Second)
	r.reset(0)
	// The snapshot from before the reset still shows the fault.
	stale := health.Snapshot{Time: r.clock.Now().Add(-time.Millisecond), Devices: sick.Devices}
	r.step(stale)
	r.step(stale)
	r.wantPhase(0, PhaseProbation)
	fresh := health.Snapshot{Time: r.clock.Now().Add(time.Second), Devices: sick.Devices}
	r.step(fresh)
	r.wantPhase(0, PhaseWaitingForPods)
}

func TestFaultNoResetClearsDuringProbationEndsTheRepair(t *testing.T) {
	r := newRig(t, Config{})
	r.step(snap(status(gpu(0), xid48)))
	r.reset(0)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseProbation)
	r.clock.Step(10 * time.Second)
	ev := r.step(snap(status(gpu(0), xid79)))
	ev = append(ev, r.step(snap(status(gpu(0), xid79)))...)
	if got := kinds(ev); !slices.Equal(got, []EventKind{KindAttemptFailed, KindCancelled}) || !strings.Contains(ev[1].Message, "does not clear") {
		t.Fatalf("events %v (%+v)", got, ev)
	}
	if st := r.m.States()[gpu(0).UUID]; st.Phase != PhaseIdle || len(st.Attempts) != 1 || len(r.env.slots) != 0 {
		t.Fatalf("state %+v, slots %v", st, r.env.slots)
	}
	r.clock.Step(time.Hour)
	r.step(snap(status(gpu(0), xid79)))
	if len(r.env.resets) != 1 {
		t.Fatalf("resets %v: a GPU with a reboot-class fault was reset again", r.env.resets)
	}
}

func TestGivenUpGPUStaysGivenUpWhileUnhealthy(t *testing.T) {
	r := newRig(t, Config{MaxAttempts: 1, Probation: time.Minute, Window: time.Hour, ResetTimeout: time.Minute})
	r.step(snap(status(gpu(0), xid48)))
	r.m.ResetFinished(gpu(0).UUID, errors.New("boom"))
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseFailed)
	r.step(snap(status(gpu(0), xid79)))
	r.wantPhase(0, PhaseFailed)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseIdle)
}

func TestNoSecondResetWhileTheFirstIsStillRunning(t *testing.T) {
	r := newRig(t, Config{})
	sick := snap(status(gpu(0), xid48))
	r.step(sick)
	r.clock.Step(30 * time.Second) // the reset times out; its command has not returned
	r.step(sick)
	r.wantPhase(0, PhaseWaitingForPods)
	r.clock.Step(RetryBackoff)
	r.step(sick)
	r.wantPhase(0, PhaseWaitingForSlot)
	if len(r.env.resets) != 1 || !strings.Contains(r.m.States()[gpu(0).UUID].Message, "not returned") {
		t.Fatalf("resets %v, state %+v", r.env.resets, r.m.States()[gpu(0).UUID])
	}
	// The late result of the first reset is not taken for the second one's.
	r.m.ResetFinished(gpu(0).UUID, nil)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	if st := r.m.States()[gpu(0).UUID]; st.ResetDone || len(r.env.resets) != 2 {
		t.Fatalf("state %+v, resets %v", st, r.env.resets)
	}
}

func TestWaitingGPUsAreAskedAboutOncePerRecheck(t *testing.T) {
	r := newRig(t, Config{})
	r.m.cfg.Recheck = 10 * time.Second
	sick := snap(status(gpu(0), xid48))
	r.env.holders[gpu(0).UUID] = []string{"a/b"}
	for range 5 {
		r.step(sick) // snapshots come faster than the recheck period
	}
	if r.env.asked != 1 {
		t.Fatalf("holders asked %d times within one recheck period, want 1", r.env.asked)
	}
	delete(r.env.holders, gpu(0).UUID)
	r.clock.Step(9 * time.Second)
	r.step(sick)
	r.wantPhase(0, PhaseWaitingForPods)
	r.clock.Step(time.Second)
	r.step(sick)
	r.wantPhase(0, PhaseResetting)
	if r.env.asked != 2 {
		t.Fatalf("holders asked %d times, want 2", r.env.asked)
	}
}

// TestFailedAttemptsBackOff: after a failed attempt the next one waits RetryBackoff, doubling
// after each failure up to Window / MaxAttempts, and the AttemptFailed event says when: a reset
// refused because another process holds the GPU does not use up every attempt in seconds.
func TestFailedAttemptsBackOff(t *testing.T) {
	r := newRig(t, Config{MaxAttempts: 5, Probation: time.Minute, Window: 5 * time.Minute, ResetTimeout: time.Minute})
	sick := snap(status(gpu(0), xid48))
	wantDelays := []time.Duration{30 * time.Second, time.Minute, time.Minute, time.Minute} // capped at 5m / 5
	r.step(sick)
	for i, want := range wantDelays {
		r.m.ResetFinished(gpu(0).UUID, errors.New("in use by another client"))
		ev := r.step(sick)
		if len(ev) != 1 || ev[0].Kind != KindAttemptFailed || !strings.Contains(ev[0].Message, "the next attempt in "+want.String()) {
			t.Fatalf("failure %d: events %+v, want AttemptFailed naming %v", i+1, ev, want)
		}
		r.clock.Step(want - time.Second)
		r.step(sick)
		if len(r.env.resets) != i+1 {
			t.Fatalf("failure %d: %d resets before the delay ran out", i+1, len(r.env.resets))
		}
		r.clock.Step(time.Second)
		r.step(sick)
		r.wantPhase(0, PhaseResetting)
	}
}

// TestWaitsSayWhyOnce: a GPU that cannot get a slot (the slot namespace missing: the agent run
// outside the chart) or cannot learn who holds it says so in a Waiting event once per reason,
// instead of staying at "Started" with nothing after it; a new reason is said again.
func TestWaitsSayWhyOnce(t *testing.T) {
	r := newRig(t, Config{})
	r.env.takeErr = errors.New(`namespaces "gpuhealth-system" not found`)
	sick := snap(status(gpu(0), xid48))
	for range 5 {
		r.step(sick)
		r.clock.Step(time.Minute)
	}
	var waits []string
	for _, e := range r.log {
		if e.Kind == KindWaiting {
			waits = append(waits, e.Message)
		}
	}
	if len(waits) != 1 || !strings.Contains(waits[0], `cannot take a remediation slot: namespaces "gpuhealth-system" not found`) {
		t.Fatalf("waiting events %q, want one naming the missing namespace", waits)
	}
	r.env.takeErr = nil
	r.env.budget = 0
	r.step(sick)
	r.step(sick)
	if last := r.log[len(r.log)-1]; last.Kind != KindWaiting || !strings.Contains(last.Message, "cluster-wide remediation slot") {
		t.Errorf("last event %+v, want the slot wait said", last)
	}
}
