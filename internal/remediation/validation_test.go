package remediation

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

// validatingEnv is fakeEnv that also runs validations (ValidationEnv): it records each start.
type validatingEnv struct {
	*fakeEnv
	started []string
}

func (e *validatingEnv) StartValidation(dev health.Device) { e.started = append(e.started, dev.UUID) }

// validationConfig: 3 attempts, 1 min probation after a passive return, 10 s after a pass.
func validationConfig() Config {
	return Config{MaxAttempts: 3, Probation: time.Minute, Window: time.Hour, ResetTimeout: 30 * time.Second,
		Validate: true, ValidationProbation: 10 * time.Second, ValidatedBy: "dcgm: dcgmi diag"}
}

type vrig struct {
	*rig
	venv *validatingEnv
}

func newValidationRig(t *testing.T, cfg Config) *vrig {
	clk := testingclock.NewFakeClock(t0)
	env := &validatingEnv{fakeEnv: newEnv()}
	env.budget = 2
	return &vrig{rig: &rig{t: t, clock: clk, env: env.fakeEnv, m: NewMachine(cfg, clk, env)}, venv: env}
}

func (r *vrig) verdict(i int, res validation.Result, msg string) {
	r.m.ValidationFinished(gpu(i).UUID, validation.Verdict{Result: res, Message: msg}, 2*time.Minute)
}

func (r *vrig) events(kind EventKind) []Event {
	var out []Event
	for _, e := range r.log {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// toValidating takes GPU 0 from an XID 48 through its reset into Validating.
func (r *vrig) toValidating() {
	r.t.Helper()
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseResetting)
	r.reset(0)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseValidating)
}

func TestValidationPassGivesTheGPUBackAfterItsProbation(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.toValidating()
	if !slices.Equal(r.venv.started, []string{gpu(0).UUID}) {
		t.Fatalf("validations started: %v, want one of GPU 0", r.venv.started)
	}
	// Until the verdict, Decorate keeps the GPU out with reason RemediationValidating.
	d := Decorate(snap(status(gpu(0))), r.m.States()).Devices[0]
	if d.Health != health.Unhealthy || d.Conditions[0].Reason != ReasonValidating {
		t.Fatalf("decorated while validating: %+v", d)
	}
	r.step(snap(status(gpu(0))))
	if len(r.venv.started) != 1 {
		t.Fatalf("a second validation started while one runs: %v", r.venv.started)
	}
	r.verdict(0, validation.Passed, "3 tests passed")
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseProbation)
	passed := r.events(KindValidationPassed)
	if len(passed) != 1 || passed[0].Validation != health.ValidationPassed || passed[0].By != "dcgm: dcgmi diag" || passed[0].Reason() != "GPUValidationPassed" {
		t.Fatalf("passed events: %+v", passed)
	}
	// The probation after a pass is the validation's (10 s), not the passive one (1 min).
	r.clock.Step(10 * time.Second)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseIdle)
	repaired := r.events(KindRepaired)
	if len(repaired) != 1 || repaired[0].Validation != "" || !strings.Contains(repaired[0].Message, "passed its validation") {
		t.Fatalf("repaired events: %+v", repaired)
	}
	if len(r.env.slots) != 0 {
		t.Errorf("slots still held: %v", r.env.slots)
	}
}

func TestValidationPassWithoutProbationReturnsAtOnce(t *testing.T) {
	cfg := validationConfig()
	cfg.ValidationProbation = 0
	r := newValidationRig(t, cfg)
	r.toValidating()
	r.verdict(0, validation.Passed, "ok")
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseIdle)
	if len(r.events(KindRepaired)) != 1 {
		t.Fatalf("events: %v", kinds(r.log))
	}
}

func TestValidationFailuresCountAsAttemptsAndEndInValidationFailed(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.toValidating()
	for attempt := 1; attempt <= 3; attempt++ {
		r.verdict(0, validation.Failed, "memory: Fail (DCGM error 95, severity ISOLATE)")
		r.step(snap(status(gpu(0))))
		if attempt == 3 {
			break
		}
		// Its own conditions are clear (the reset cleared them), yet it stays out and waits for
		// another reset.
		r.wantPhase(0, PhaseWaitingForPods)
		st := r.m.States()[gpu(0).UUID]
		if !st.ValidationFailed || len(st.Attempts) != attempt {
			t.Fatalf("after failure %d: %+v", attempt, st)
		}
		d := Decorate(snap(status(gpu(0))), r.m.States()).Devices[0]
		if d.Health != health.Unhealthy || d.Conditions[0].Reason != ReasonValidationFailed {
			t.Fatalf("decorated after a failed validation: %+v", d)
		}
		r.clock.Step(time.Hour / 3)
		r.step(snap(status(gpu(0))))
		r.wantPhase(0, PhaseResetting)
		r.reset(0)
		r.step(snap(status(gpu(0))))
		r.wantPhase(0, PhaseValidating)
	}
	r.wantPhase(0, PhaseFailed)
	st := r.m.States()[gpu(0).UUID]
	if st.FailReason != ReasonValidationFailed || len(st.Attempts) != 3 {
		t.Fatalf("given up: %+v", st)
	}
	failed := r.events(KindValidationFailed)
	if len(failed) != 3 || failed[0].Validation != health.ValidationFailed || !strings.Contains(failed[0].Message, "severity ISOLATE") || !failed[0].Warning {
		t.Fatalf("failed events: %+v", failed)
	}
	// No fault of its own, and yet it stays given up: only a reboot or a request brings it back.
	r.clock.Step(time.Minute)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseFailed)
	d := Decorate(snap(status(gpu(0))), r.m.States()).Devices[0]
	if d.Health != health.Unhealthy || d.Conditions[0].Reason != ReasonValidationFailed || d.Conditions[0].RecommendedAction != health.ActionRebootNode {
		t.Fatalf("decorated when given up: %+v", d)
	}
}

func TestValidationErrorKeepsTheGPUOutAndCountsNothing(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.toValidating()
	r.verdict(0, validation.Error, "dcgmi exited 235: unable to connect to the host engine")
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseValidating)
	st := r.m.States()[gpu(0).UUID]
	if len(st.Attempts) != 1 || st.ValidationErrors != 1 {
		t.Fatalf("after an error: %+v (the reset is the only attempt)", st)
	}
	errs := r.events(KindValidationError)
	if len(errs) != 1 || errs[0].Validation != "" || errs[0].Reason() != "GPUValidationError" || !strings.Contains(errs[0].Message, "tested again in 1m0s") {
		t.Fatalf("error events: %+v", errs)
	}
	// Not before the backoff.
	r.clock.Step(59 * time.Second)
	r.step(snap(status(gpu(0))))
	if len(r.venv.started) != 1 {
		t.Fatalf("run again before the backoff: %v", r.venv.started)
	}
	r.clock.Step(time.Second)
	r.step(snap(status(gpu(0))))
	if len(r.venv.started) != 2 {
		t.Fatalf("not run again after the backoff: %v", r.venv.started)
	}
	r.verdict(0, validation.Error, "timed out after 15m0s")
	r.step(snap(status(gpu(0))))
	if errs := r.events(KindValidationError); !strings.Contains(errs[1].Message, "tested again in 2m0s") {
		t.Fatalf("the second error's backoff: %q", errs[1].Message)
	}
	if d := Decorate(snap(status(gpu(0))), r.m.States()).Devices[0]; d.Health != health.Unhealthy {
		t.Fatalf("a GPU with no verdict is offered: %+v", d)
	}
}

func TestOneValidationAtATimePerNode(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.step(snap(status(gpu(0), xid48), status(gpu(1), xid48)))
	r.reset(0)
	r.reset(1)
	r.step(snap(status(gpu(0)), status(gpu(1))))
	r.wantPhase(0, PhaseValidating)
	r.wantPhase(1, PhaseValidating)
	if len(r.venv.started) != 1 {
		t.Fatalf("validations started at once: %v", r.venv.started)
	}
	first := r.venv.started[0]
	i := slices.IndexFunc([]string{gpu(0).UUID, gpu(1).UUID}, func(u string) bool { return u == first })
	r.verdict(i, validation.Passed, "ok")
	r.step(snap(status(gpu(0)), status(gpu(1))))
	r.step(snap(status(gpu(0)), status(gpu(1))))
	if len(r.venv.started) != 2 || r.venv.started[1] == first {
		t.Fatalf("the second GPU's validation after the first: %v", r.venv.started)
	}
}

func TestAFaultDuringValidationFailsIt(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.toValidating()
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseWaitingForPods)
	if st := r.m.States()[gpu(0).UUID]; !st.ValidationFailed || st.FailReason != ReasonValidationFailed {
		t.Fatalf("after a fault during validation: %+v", st)
	}
	if f := r.events(KindValidationFailed); len(f) != 1 || !strings.Contains(f[0].Message, "XID48") {
		t.Fatalf("failed events: %+v", f)
	}
}

func TestWithoutValidationAReturnIsPassive(t *testing.T) {
	cfg := validationConfig()
	cfg.Validate = false
	r := newValidationRig(t, cfg)
	r.step(snap(status(gpu(0), xid48)))
	r.reset(0)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseProbation)
	r.clock.Step(time.Minute)
	r.step(snap(status(gpu(0))))
	repaired := r.events(KindRepaired)
	if len(repaired) != 1 || repaired[0].Validation != health.ValidationPassive || !strings.Contains(repaired[0].Message, "passive") {
		t.Fatalf("repaired events: %+v", repaired)
	}
	if len(r.venv.started) != 0 {
		t.Fatalf("validations without validation: %v", r.venv.started)
	}
}

func TestAfterARebootAFaultyGPUIsValidatedBeforeItIsOffered(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.m.ValidateAfterReboot([]string{gpu(1).UUID})
	// Kept out before the first Step: the first report already has it.
	d := Decorate(snap(status(gpu(0)), status(gpu(1))), r.m.States())
	if d.Devices[0].Health != health.Healthy || d.Devices[1].Health != health.Unhealthy || d.Devices[1].Conditions[0].Reason != ReasonValidating {
		t.Fatalf("decorated after the reboot: %+v", d.Devices)
	}
	r.step(snap(status(gpu(0)), status(gpu(1))))
	r.wantPhase(1, PhaseValidating)
	if len(r.env.resets) != 0 || !slices.Equal(r.venv.started, []string{gpu(1).UUID}) {
		t.Fatalf("resets %v, validations %v: want a validation alone", r.env.resets, r.venv.started)
	}
	if s := r.events(KindStarted); len(s) != 1 || s[0].Device.Index != 1 || !strings.Contains(s[0].Message, "rebooted") {
		t.Fatalf("started events: %+v", s)
	}
	r.verdict(1, validation.Passed, "ok")
	r.step(snap(status(gpu(0)), status(gpu(1))))
	r.clock.Step(10 * time.Second)
	r.step(snap(status(gpu(0)), status(gpu(1))))
	r.wantPhase(1, PhaseIdle)
	if st := r.m.States()[gpu(1).UUID]; len(st.Attempts) != 0 {
		t.Fatalf("a passed validation alone counted an attempt: %+v", st)
	}
}

func TestAnOperatorsRequestValidatesAnIdleGPU(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.env.holders[gpu(0).UUID] = []string{"ns/job"}
	r.m.RequestValidation(gpu(0).UUID, "by alice: after RMA")
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseWaitingForPods)
	if d := Decorate(snap(status(gpu(0))), r.m.States()).Devices[0]; d.Health != health.Unhealthy {
		t.Fatalf("a GPU waiting for its validation is offered: %+v", d)
	}
	delete(r.env.holders, gpu(0).UUID)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseValidating)
	r.verdict(0, validation.Failed, "memory: Fail")
	r.step(snap(status(gpu(0))))
	// A validation alone that fails counts as an attempt; the GPU then needs a reset.
	if st := r.m.States()[gpu(0).UUID]; len(st.Attempts) != 1 || st.ValidateOnly || !st.ValidationFailed {
		t.Fatalf("after the failed validation: %+v", st)
	}
	r.clock.Step(time.Minute)
	r.step(snap(status(gpu(0))))
	r.wantPhase(0, PhaseResetting)
}

func TestAValidationInterruptedByARestartRunsAgain(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.m.Restore(map[string]State{gpu(0).UUID: {Phase: PhaseValidating, Since: t0, FaultSince: t0, Attempts: []time.Time{t0}}})
	r.env.slots = []string{gpu(0).UUID}
	r.step(snap(status(gpu(0))))
	if !slices.Equal(r.venv.started, []string{gpu(0).UUID}) {
		t.Fatalf("validations after the restart: %v", r.venv.started)
	}
}

func TestUnderRepairBeforeRebootReadsTheStateFileOfAnotherBoot(t *testing.T) {
	path := t.TempDir() + "/remediation.json"
	if err := SaveState(path, "boot-1", map[string]State{
		gpu(0).UUID: {Phase: PhaseValidating}, gpu(1).UUID: {Phase: PhaseFailed, FailReason: ReasonValidationFailed},
		gpu(2).UUID: {Attempts: []time.Time{t0}}, // repaired; only its attempts still count
	}); err != nil {
		t.Fatal(err)
	}
	got, err := UnderRepairBeforeReboot(path, "boot-2")
	if err != nil || !slices.Equal(got, []string{gpu(0).UUID, gpu(1).UUID}) {
		t.Fatalf("after a reboot: %v %v, want GPUs 0 and 1", got, err)
	}
	if got, err := UnderRepairBeforeReboot(path, "boot-1"); err != nil || len(got) != 0 {
		t.Fatalf("same boot: %v %v, want none", got, err)
	}
	if got, err := UnderRepairBeforeReboot(t.TempDir()+"/none.json", "boot-2"); err != nil || len(got) != 0 {
		t.Fatalf("no file: %v %v", got, err)
	}
}

// blockingValidator passes GPU-a's tests and never ends GPU-b's (until its context is done).
type blockingValidator struct{ calls chan string }

func (v *blockingValidator) Validate(ctx context.Context, dev health.Device) validation.Verdict {
	v.calls <- dev.UUID
	if dev.UUID == gpu(1).UUID {
		<-ctx.Done()
		return validation.Verdict{Result: validation.Passed, Message: "a pass from a run cut short must not count"}
	}
	return validation.Verdict{Result: validation.Passed, Message: "3 tests passed"}
}

type recorded struct {
	uuid   string
	result health.ValidationResult
	by     string
}

func TestControllerValidatesRecordsAndTimesOut(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	statePath := filepath.Join(t.TempDir(), StateFileName)
	// GPU-b was being validated when the node went down.
	if err := SaveState(statePath, "boot-1", map[string]State{gpu(1).UUID: {Phase: PhaseValidating, Since: t0}}); err != nil {
		t.Fatal(err)
	}
	env := &lockedEnv{env: newEnv()}
	env.env.budget = 2
	recorder := record.NewFakeRecorder(100)
	var ctrl *Controller
	resetter := &simResetter{clock: clk, ctrl: func() *Controller { return ctrl }, calls: make(chan string, 10)}
	validator := &blockingValidator{calls: make(chan string, 10)}
	var mu sync.Mutex
	var history []recorded
	obs := &observer{}
	cfg := validationConfig()
	cfg.ValidationProbation = 0
	opts := Options{
		NodeName: "n1", Config: cfg, Poll: time.Second, Clock: clk, Holders: env, Slots: env, Resetter: resetter,
		StatePath: statePath, BootID: "boot-2", Recorder: recorder, NodeRef: &corev1.ObjectReference{Kind: "Node", Name: "n1"},
		Observer: obs, Validator: validator, ValidationTimeout: 50 * time.Millisecond, AfterReboot: true,
		Validated: func(uuid string, result health.ValidationResult, by string, _ time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			history = append(history, recorded{uuid, result, by})
			return nil
		},
	}
	var err error
	if ctrl, err = New(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	// Before any Step, GPU-b (under repair before the reboot) is kept out.
	if d := ctrl.Decorate(health.Snapshot{Devices: []health.DeviceStatus{status(gpu(1))}}).Devices[0]; d.Health != health.Unhealthy {
		t.Fatalf("GPU-b after the reboot: %+v", d)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	ctrl.Update(health.Snapshot{Time: t0, Devices: []health.DeviceStatus{status(gpu(0), xid48), status(gpu(1))}})

	// GPU-b's test runs first (nothing to reset) and is cut off at the timeout: no verdict.
	if got := <-validator.calls; got != gpu(1).UUID {
		t.Fatalf("first validation of %s, want GPU-b's", got)
	}
	healthtest.Eventually(t, "GPU-b's error", func() bool { return ctrl.States()[gpu(1).UUID].ValidationErrors == 1 })
	if st := ctrl.States()[gpu(1).UUID]; st.Phase != PhaseValidating || len(st.Attempts) != 0 {
		t.Fatalf("GPU-b after a run cut short: %+v", st)
	}
	// GPU-a, reset meanwhile, is validated once the node's one test slot is free, and returns.
	<-resetter.calls
	ctrl.Update(health.Snapshot{Time: t0.Add(time.Second), Devices: []health.DeviceStatus{status(gpu(0)), status(gpu(1))}})
	if got := <-validator.calls; got != gpu(0).UUID {
		t.Fatalf("second validation of %s, want GPU-a's", got)
	}
	healthtest.Eventually(t, "GPU-a back", func() bool {
		st, ok := ctrl.States()[gpu(0).UUID]
		return ok && st.Phase == PhaseIdle
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(history) != 1 || history[0] != (recorded{gpu(0).UUID, health.ValidationPassed, "dcgm: dcgmi diag"}) {
		t.Errorf("history records %+v, want GPU-a's pass only", history)
	}
	close(recorder.Events)
	var all []string
	for e := range recorder.Events {
		all = append(all, e)
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"Warning GPUValidationError GPU 1 (GPU-b): could not validate the GPU", "the test was cut short",
		"Normal GPUValidationPassed GPU 0 (GPU-a)", "Normal GPURemediationStarted GPU 1 (GPU-b): the GPU had a fault when the node rebooted"} {
		if !strings.Contains(joined, want) {
			t.Errorf("Events lack %q:\n%s", want, joined)
		}
	}
}

// The backend's reset reaches the machine in the snapshot, as the GPU's history records it: a GPU
// whose validation failed has no condition for the reset to end, and is still seen reset.
func TestAResetIsSeenInTheSnapshotsHistory(t *testing.T) {
	r := newValidationRig(t, validationConfig())
	r.step(snap(status(gpu(0), xid48)))
	r.wantPhase(0, PhaseResetting)
	r.m.ResetFinished(gpu(0).UUID, nil)
	r.clock.Step(time.Second)
	reset := status(gpu(0))
	reset.History = []health.HistoryEntry{{Time: t0.Add(-time.Hour), Kind: health.HistoryFault, Reason: "XID48"}}
	r.step(snap(reset))
	r.wantPhase(0, PhaseResetting) // the command returned; no reset recorded since the phase began
	reset.History = append(reset.History, health.HistoryEntry{Time: r.clock.Now(), Kind: health.HistoryReset})
	r.step(snap(reset))
	r.wantPhase(0, PhaseValidating)
}
