// Package remediation repairs a GPU whose faults a GPU reset clears, one GPU at a time and never
// under a running pod:
//
//	(fault) ─▶ WaitingForPods ─▶ WaitingForSlot ─▶ Resetting ─▶ [Validating] ─▶ Probation ─▶ (back in service)
//	               ▲   │ drained          │                │              │ failed      │
//	               │   ▼                  │ failed/timeout │              │             │ fault back
//	               │ BlockedByDrain       ▼                ▼              ▼             ▼
//	               └──────────── attempt failed: retry, or RemediationFailed after maxAttempts
//
// With validation on (Config.Validate), a reset GPU goes back only after an active test of that
// GPU passes (Validating): a failure is a failed attempt, a run that gives no verdict keeps the
// GPU out and is run again later. A validation alone (after a reboot, or on an operator's
// request: State.ValidateOnly) takes the same path without the reset.
//
// The Machine is the state machine of every GPU of one node. It reads time from an injected
// clock and does its I/O through Env (who holds the GPU, the cluster-wide slots, the reset), so
// tests drive it with fakes and a fake clock. The agent's Controller runs it (controller.go).
package remediation

import (
	"context"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Phase is where a GPU is in its repair. The empty phase means no repair is under way.
type Phase string

// Phases.
const (
	PhaseIdle           Phase = ""
	PhaseWaitingForPods Phase = "WaitingForPods"
	PhaseWaitingForSlot Phase = "WaitingForSlot"
	// PhasePausingComponents: the GPU holds a slot and waits for the GPU operator's components
	// remediation paused to leave the node (see ComponentPauser).
	PhasePausingComponents Phase = "PausingComponents"
	PhaseResetting         Phase = "Resetting"
	// PhaseValidating: an active test of the GPU (Config.Validate) decides whether it goes back.
	PhaseValidating Phase = "Validating"
	PhaseProbation  Phase = "Probation"
	PhaseBlocked    Phase = "BlockedByDrain"
	PhaseFailed     Phase = "RemediationFailed"
)

// State is one GPU's repair, as persisted in the state file.
type State struct {
	Phase Phase     `json:"phase"`
	Since time.Time `json:"since"`
	// FaultSince is when this repair began; Fault describes the faults it repairs.
	FaultSince time.Time `json:"faultSince,omitzero"`
	Fault      string    `json:"fault,omitempty"`
	// Attempts are the start times of the resets still within the window.
	Attempts []time.Time `json:"attempts,omitempty"`
	// Message says what the GPU waits for, or why the last attempt failed.
	Message string `json:"message,omitempty"`
	// Evict is set once the grace period for the pods holding the GPU has run out.
	Evict bool `json:"evict,omitempty"`
	// ResetDone: the reset command succeeded; ResetObserved: the backend reported the reset.
	// Interrupted: the agent restarted while the reset was in flight.
	ResetDone     bool `json:"resetDone,omitempty"`
	ResetObserved bool `json:"resetObserved,omitempty"`
	// ResetSeenAt is when the backend reported the reset: snapshots older than it predate the
	// reset and say nothing about the GPU after it.
	ResetSeenAt time.Time `json:"resetSeenAt,omitzero"`
	Interrupted bool      `json:"interrupted,omitempty"`
	// ValidateOnly: the repair is a validation alone, without a reset (after a reboot, or on
	// an operator's request); Requested says who asked and why.
	ValidateOnly bool   `json:"validateOnly,omitempty"`
	Requested    string `json:"requested,omitempty"`
	// ValidationFailed: the GPU's last validation failed. Its own conditions may all be clear
	// (the reset cleared them), but it needs another repair.
	ValidationFailed bool `json:"validationFailed,omitempty"`
	// Validated: the GPU passed its validation in this repair (its probation follows).
	Validated bool `json:"validated,omitempty"`
	// ValidationErrors counts the runs in a row that gave no verdict, for their backoff.
	ValidationErrors int `json:"validationErrors,omitempty"`
	// FailReason is why the last attempt failed when that has a reason of its own
	// (ReasonValidationFailed): the reason of a given-up GPU's condition.
	FailReason string `json:"failReason,omitempty"`
}

// Active reports whether the state is worth keeping: a repair under way, or attempts that still
// count.
func (s State) Active() bool { return s.Phase != PhaseIdle || len(s.Attempts) > 0 }

// HoldsSlot reports whether the GPU holds a cluster-wide remediation slot in this phase.
func (s State) HoldsSlot() bool {
	return s.Phase == PhasePausingComponents || s.Phase == PhaseResetting || s.Phase == PhaseValidating || s.Phase == PhaseProbation
}

// needsComponentsPaused reports whether the GPU needs the operator's components kept paused.
func (s State) needsComponentsPaused() bool {
	return s.Phase == PhasePausingComponents || s.Phase == PhaseResetting
}

// Config is the machine's configuration (see config.RemediationConfig).
type Config struct {
	MaxAttempts  int
	Probation    time.Duration
	Window       time.Duration
	ResetTimeout time.Duration
	// EvictAfter is the grace period before eviction of the pods holding a GPU; zero or less
	// never evicts.
	EvictAfter time.Duration
	// Recheck is how long a waiting GPU waits before its holders or a slot are asked again
	// (zero: at every Step). Steps come with every snapshot; this bounds the API calls.
	Recheck time.Duration
	// PauseComponents lets the machine pause the GPU operator's components that hold a GPU
	// (ComponentEnv); without it such a GPU waits.
	PauseComponents bool
	// Validate tests every reset GPU actively before it goes back (ValidationEnv);
	// ValidationProbation is the probation after a pass (zero: none), and ValidatedBy says
	// what tests, for the GPU's history ("dcgm: dcgmi").
	Validate            bool
	ValidationProbation time.Duration
	ValidatedBy         string
}

// Env is what the machine needs from the world.
type Env interface {
	// Holders names the pods that hold the GPU (or one of its MIG instances) now.
	Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error)
	// TakeSlot takes (or confirms) a cluster-wide remediation slot for the GPU.
	TakeSlot(ctx context.Context, uuid string) (bool, error)
	// ReleaseSlot gives the GPU's slot back.
	ReleaseSlot(ctx context.Context, uuid string) error
	// StartReset starts resetting the GPU and returns at once; the result comes back through
	// Machine.ResetFinished.
	StartReset(dev health.Device)
}

// ComponentEnv is what handling the GPU operator's components needs; an Env without it has
// none (the Controller implements it).
type ComponentEnv interface {
	// Components lists the operator's components running on the node.
	Components(ctx context.Context) ([]Component, error)
	// PauseComponents pauses the components of the labels (recorded first) and returns the
	// labels it changed.
	PauseComponents(ctx context.Context, labels []string) ([]string, error)
	// RestoreComponents restores what was paused and returns the labels restored.
	RestoreComponents(ctx context.Context) ([]string, error)
	// PausedComponents lists the labels paused and not restored yet.
	PausedComponents() []string
}

// EventKind classifies what happened, for metrics.
type EventKind string

// Event kinds.
const (
	KindStarted       EventKind = "Started"
	KindWaiting       EventKind = "Waiting"
	KindEvicting      EventKind = "Evicting"
	KindBlocked       EventKind = "Blocked"
	KindResetStarted  EventKind = "ResetStarted"
	KindResetObserved EventKind = "ResetObserved"
	KindRepaired      EventKind = "Repaired"
	KindAttemptFailed EventKind = "AttemptFailed"
	KindGaveUp        EventKind = "GaveUp"
	KindCancelled     EventKind = "Cancelled"
	// KindPausedComponents and KindRestoredComponents: the GPU operator's components paused
	// for a reset, and restored after it.
	KindPausedComponents   EventKind = "PausedComponents"
	KindRestoredComponents EventKind = "RestoredComponents"
	// The validation of a GPU: started, and its verdict (Event reasons GPUValidation...).
	KindValidationStarted EventKind = "ValidationStarted"
	KindValidationPassed  EventKind = "ValidationPassed"
	KindValidationFailed  EventKind = "ValidationFailed"
	KindValidationError   EventKind = "ValidationError"
)

// Event is one step of a repair, for a Kubernetes Event, a log line and the metrics.
type Event struct {
	Device  health.Device
	Kind    EventKind
	Warning bool
	Message string
	// Duration is, for KindRepaired, the time from the start of the repair to the GPU's return
	// to service, and for a validation's verdict how long the test ran.
	Duration time.Duration
	// Validation is set on the Events that judge a GPU's return to service (a verdict, or a
	// return without a test: passive), for the GPU's history; By says what judged it.
	Validation health.ValidationResult
	By         string
}

// Reason is the Kubernetes Event reason: GPURemediation<Kind>, and GPUValidation<Verdict> for
// a validation.
func (e Event) Reason() string {
	if v, ok := strings.CutPrefix(string(e.Kind), "Validation"); ok {
		return "GPUValidation" + v
	}
	return "GPURemediation" + string(e.Kind)
}

// Machine holds the repair state of one node's GPUs. Step must be called from one goroutine;
// the other methods may be called from any.
type Machine struct {
	cfg   Config
	clock clock.PassiveClock
	env   Env

	gpus map[string]State // owned by the goroutine calling Step
	// notBefore is when a waiting GPU is asked about again (owned by Step's goroutine).
	notBefore map[string]time.Time
	// pausedFor is the GPU the operator's components were last paused for, and restoreErr the
	// last failure to restore them (owned by Step's goroutine).
	pausedFor  health.Device
	restoreErr string

	mu        sync.Mutex
	published map[string]State
	results   map[string]error     // reset command results not yet seen by Step
	observed  map[string]time.Time // resets the backend reported, not yet seen by Step
	inFlight  map[string]bool      // resets started and not returned: never two at once
	// verdicts are validation verdicts not yet seen by Step; validating is the GPU whose
	// validation runs ("" when none: DCGM's host engine runs one diagnostic at a time, so a
	// node validates one GPU at a time); requests are operators' validation requests not yet
	// seen by Step, by UUID.
	verdicts   map[string]verdict
	validating string
	requests   map[string]string
	// announce are Started Events to emit at the GPU's next Step (owned by Step's goroutine).
	announce map[string]string
}

// RetryBackoff is how long the first retry after a failed attempt waits; each further failure
// doubles it, up to the window shared by the attempts (Window / MaxAttempts), so that every
// attempt allowed fits in the window.
const RetryBackoff = 30 * time.Second

// retryDelay is how long the attempt after the n-th failed one waits.
func (m *Machine) retryDelay(n int) time.Duration {
	limit := m.cfg.Window / time.Duration(max(m.cfg.MaxAttempts, 1))
	d := RetryBackoff
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, max(limit, time.Second))
}

// NewMachine returns a machine with no repair under way.
func NewMachine(cfg Config, clk clock.PassiveClock, env Env) *Machine {
	return &Machine{cfg: cfg, clock: clk, env: env, gpus: map[string]State{}, notBefore: map[string]time.Time{}, published: map[string]State{},
		results: map[string]error{}, observed: map[string]time.Time{}, inFlight: map[string]bool{},
		verdicts: map[string]verdict{}, requests: map[string]string{}, announce: map[string]string{}}
}

// Restore starts from persisted states. A reset in flight when the agent stopped is marked
// interrupted: the next Step resumes it (the fault is gone: probation) or rolls it back (the
// fault is still there: the attempt failed).
func (m *Machine) Restore(states map[string]State) {
	for uuid, s := range states {
		if s.Phase == PhaseResetting {
			s.Interrupted = true
		}
		m.gpus[uuid] = s
	}
	m.publish()
}

// ResetFinished hands the result of a reset started by Env.StartReset to the machine.
func (m *Machine) ResetFinished(uuid string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.results[uuid] = err
	delete(m.inFlight, uuid)
}

// resetInFlight reports whether a reset of the GPU has started and not returned (one that timed
// out is still running until its command ends).
func (m *Machine) resetInFlight(uuid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inFlight[uuid]
}

func (m *Machine) startReset(dev health.Device) {
	m.mu.Lock()
	m.inFlight[dev.UUID] = true
	m.mu.Unlock()
	m.env.StartReset(dev)
}

// ResetObserved records that the backend reported a reset of the GPU at the given time (the
// library's reset signal).
func (m *Machine) ResetObserved(uuid string, at time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if prev, ok := m.observed[uuid]; !ok || at.After(prev) {
		m.observed[uuid] = at
	}
}

// lastReset is when a GPU's history last recorded a reset.
func lastReset(h []health.HistoryEntry) (time.Time, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Kind == health.HistoryReset {
			return h[i].Time, true
		}
	}
	return time.Time{}, false
}

// States returns every GPU's repair state that is worth keeping, by UUID.
func (m *Machine) States() map[string]State {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]State, len(m.published))
	for k, v := range m.published {
		out[k] = v
	}
	return out
}

func (m *Machine) publish() {
	out := make(map[string]State, len(m.gpus))
	for k, v := range m.gpus {
		if v.Active() {
			out[k] = v
		}
	}
	m.mu.Lock()
	m.published = out
	m.mu.Unlock()
}

// Step advances every GPU of snap by what the snapshot, the clock and Env say, and returns what
// happened. It is the only method that calls Env.
func (m *Machine) Step(ctx context.Context, snap health.Snapshot) []Event {
	now := m.clock.Now()
	m.mu.Lock()
	results, observed, verdicts, requests := m.results, m.observed, m.verdicts, m.requests
	m.results, m.observed, m.verdicts, m.requests = map[string]error{}, map[string]time.Time{}, map[string]verdict{}, map[string]string{}
	m.mu.Unlock()

	var events []Event
	seen := map[string]bool{}
	migs := map[string][]health.Device{}
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			migs[d.Device.MIG.ParentUUID] = append(migs[d.Device.MIG.ParentUUID], d.Device)
		}
	}
	for _, d := range snap.Devices {
		if d.Device.MIG != nil {
			continue
		}
		uuid := d.Device.UUID
		seen[uuid] = true
		st := m.gpus[uuid]
		in := input{facts: FactsOf(d), migs: migs[uuid], snapTime: snap.Time}
		if err, ok := results[uuid]; ok {
			in.result, in.finished = err, true
		}
		if at, ok := observed[uuid]; ok {
			in.observedAt, in.observed = at, true
		}
		// The snapshot says it too: the GPU's history records every reset the backend reported.
		if at, ok := lastReset(d.History); ok && (!in.observed || at.After(in.observedAt)) {
			in.observedAt, in.observed = at, true
		}
		if v, ok := verdicts[uuid]; ok {
			in.verdict, in.judged = v, true
		}
		in.request = requests[uuid]
		if msg, ok := m.announce[uuid]; ok {
			delete(m.announce, uuid)
			events = append(events, Event{Device: d.Device, Kind: KindStarted, Message: msg})
		}
		events = m.step(ctx, d.Device, &st, in, now, events)
		if st.Active() {
			m.gpus[uuid] = st
		} else {
			delete(m.gpus, uuid)
		}
	}
	for uuid, st := range m.gpus {
		if !seen[uuid] {
			delete(m.notBefore, uuid)
			// The GPU is gone from the node's inventory: nothing left to repair.
			if st.HoldsSlot() {
				m.release(ctx, uuid)
			}
			delete(m.gpus, uuid)
		}
	}
	events = m.restoreComponents(ctx, events)
	m.publish()
	return events
}

// restoreComponents restores the operator's components once no GPU needs them paused (also
// those an earlier agent paused and did not restore). A failure is said once, and tried again at
// every Step.
func (m *Machine) restoreComponents(ctx context.Context, events []Event) []Event {
	ce, ok := m.env.(ComponentEnv)
	if !ok || len(ce.PausedComponents()) == 0 {
		return events
	}
	for _, st := range m.gpus {
		if st.needsComponentsPaused() {
			return events
		}
	}
	restored, err := ce.RestoreComponents(ctx)
	if err != nil {
		if msg := err.Error(); msg != m.restoreErr {
			m.restoreErr = msg
			events = append(events, Event{Device: m.pausedFor, Kind: KindRestoredComponents, Warning: true,
				Message: "could not restore the GPU operator's components yet (tried again): " + msg})
		}
		return events
	}
	m.restoreErr = ""
	if len(restored) > 0 {
		events = append(events, Event{Device: m.pausedFor, Kind: KindRestoredComponents,
			Message: "restored the GPU operator's components after the reset: " + strings.Join(restored, ", ") + " back to their values"})
	}
	return events
}
