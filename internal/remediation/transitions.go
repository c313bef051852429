package remediation

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The transitions of one GPU; see the package comment for the picture.

type input struct {
	facts      Facts
	migs       []health.Device
	result     error
	finished   bool
	observedAt time.Time
	observed   bool
	snapTime   time.Time
	// verdict is a validation's verdict (judged: one arrived); request an operator's request
	// for a validation (who and why), "" for none.
	verdict verdict
	judged  bool
	request string
}

func (m *Machine) step(ctx context.Context, dev health.Device, st *State, in input, now time.Time, events []Event) []Event {
	st.Attempts = slices.DeleteFunc(st.Attempts, func(a time.Time) bool { return now.Sub(a) >= m.cfg.Window })
	t := &transition{m: m, ctx: ctx, dev: dev, st: st, in: in, f: in.facts, now: now, events: events}
	if in.request != "" {
		t.requested(in.request)
	}
	// A few transitions can follow one another at one instant (a fault on an idle GPU with a
	// free slot goes straight to the reset); each pass either ends the step or changes the phase.
	for range 4 {
		if t.pass() == done {
			break
		}
	}
	return t.events
}

// transition is one step of one GPU: what the phases read (the input, the facts of its snapshot,
// the time) and change (its State, the Machine's timers), and the Events they emit.
type transition struct {
	m      *Machine
	ctx    context.Context
	dev    health.Device
	st     *State
	in     input
	f      Facts
	now    time.Time
	events []Event
}

// next says whether a phase ended the step (done) or changed the phase, for another pass (again).
type next bool

const (
	done  next = false
	again next = true
)

// pass runs the GPU's current phase once.
func (t *transition) pass() next {
	switch t.st.Phase {
	case PhaseIdle:
		return t.idle()
	case PhaseWaitingForPods, PhaseWaitingForSlot, PhaseBlocked:
		return t.waiting()
	case PhasePausingComponents:
		return t.pausingComponents()
	case PhaseResetting:
		return t.resetting()
	case PhaseValidating:
		return t.validating()
	case PhaseProbation:
		return t.probation()
	case PhaseFailed:
		return t.failed()
	default:
		// A state file from a newer version: start over.
		*t.st = State{Attempts: t.st.Attempts}
		return again
	}
}

func (t *transition) emit(kind EventKind, warning bool, format string, args ...any) {
	t.events = append(t.events, Event{Device: t.dev, Kind: kind, Warning: warning, Message: fmt.Sprintf(format, args...)})
}

func (t *transition) enter(p Phase, msg string) {
	t.st.Phase, t.st.Since, t.st.Message = p, t.now, msg
}

// fail ends an attempt: the slot is given back, and the GPU waits for the next attempt (longer
// after each failure) or, after maxAttempts within the window, is given up on.
func (t *transition) fail(why string) { t.failBecause("", why) }

// failBecause is fail with a reason of its own for a given-up GPU's condition
// (ReasonValidationFailed; "" is ReasonRemediationFailed).
func (t *transition) failBecause(reason, why string) {
	m, st := t.m, t.st
	if st.HoldsSlot() {
		m.release(t.ctx, t.dev.UUID)
	}
	st.ResetDone, st.ResetObserved, st.Interrupted, st.Evict, st.ResetSeenAt = false, false, false, false, time.Time{}
	st.Validated, st.ValidationErrors, st.FailReason = false, 0, reason
	if len(st.Attempts) >= m.cfg.MaxAttempts {
		t.emit(KindAttemptFailed, true, "reset attempt %d of %d failed: %s", len(st.Attempts), m.cfg.MaxAttempts, why)
		t.enter(PhaseFailed, fmt.Sprintf("gave up after %d resets within %v; last: %s", len(st.Attempts), m.cfg.Window, why))
		t.emit(KindGaveUp, true, "%s: the GPU stays out of service; reboot or power-cycle the node, or replace the GPU", st.Message)
		return
	}
	// The next attempt waits, longer after each failure: what made this one fail (another
	// process holding the GPU, a driver busy with something else) rarely ends at once, and
	// attempts in quick succession would use up maxAttempts in seconds.
	delay := m.retryDelay(len(st.Attempts))
	m.notBefore[t.dev.UUID] = t.now.Add(delay)
	t.emit(KindAttemptFailed, true, "reset attempt %d of %d failed: %s; the next attempt in %v", len(st.Attempts), m.cfg.MaxAttempts, why, delay)
	t.enter(PhaseWaitingForPods, why)
}

// later asks about the GPU again after Recheck.
func (t *transition) later() { t.m.notBefore[t.dev.UUID] = t.now.Add(t.m.cfg.Recheck) }

// wait records why the GPU waits and says it once per reason (an Event, the log and the events
// metric through the controller): nothing waits silently.
func (t *transition) wait(msg string) next {
	t.later()
	if msg != t.st.Message {
		t.st.Message = msg
		t.emit(KindWaiting, false, "%s", msg)
	}
	return done
}

// waitHeld is wait for a GPU something holds: it waits in PhaseWaitingForPods, and the Event
// says what (event) once per holder (msg).
func (t *transition) waitHeld(msg, event string) {
	t.later()
	if t.st.Phase != PhaseWaitingForPods {
		t.enter(PhaseWaitingForPods, "")
	}
	if msg != t.st.Message {
		t.st.Message = msg
		t.emit(KindWaiting, false, "%s", event)
	}
}

// beginReset counts an attempt and starts the reset; said says how it came to be.
func (t *transition) beginReset(said string) next {
	st := t.st
	st.Attempts = append(st.Attempts, t.now)
	t.enter(PhaseResetting, "")
	st.ResetDone, st.ResetObserved, st.Interrupted, st.ResetSeenAt = false, false, false, time.Time{}
	t.emit(KindResetStarted, false, "%s (attempt %d of %d)", said, len(st.Attempts), t.m.cfg.MaxAttempts)
	t.m.startReset(t.dev)
	return done
}

// idle: a fault that a reset clears starts a repair, unless the GPU used up its attempts.
func (t *transition) idle() next {
	m, st, f := t.m, t.st, t.f
	if !f.NeedsReset {
		return done
	}
	if len(st.Attempts) >= m.cfg.MaxAttempts {
		t.enter(PhaseFailed, fmt.Sprintf("%s again after %d resets within %v", f.Fault, len(st.Attempts), m.cfg.Window))
		st.Fault = f.Fault
		t.emit(KindGaveUp, true, "%s: the GPU stays out of service; reboot or power-cycle the node, or replace the GPU", st.Message)
		return done
	}
	st.FaultSince, st.Fault = t.now, f.Fault
	t.enter(PhaseWaitingForPods, "")
	t.emit(KindStarted, false, "needs a GPU reset (%s); it is reset once no pod holds it", f.Fault)
	return again
}

// waiting: the GPU waits for its pods to end, for the GPU operator's components, and for a
// cluster-wide slot; a drain blocks it, a fault that went away cancels the repair.
func (t *transition) waiting() next {
	m, st, f, dev := t.m, t.st, t.f, t.dev
	// A GPU whose validation failed needs another reset although none of its own conditions
	// says so (the reset cleared them).
	needsReset := f.NeedsReset || (st.ValidationFailed && !f.Unhealthy)
	if st.ValidateOnly && f.Unhealthy {
		if !f.NeedsReset {
			// The fault keeps it out anyway; it is validated once the fault is gone.
			return t.wait("the GPU has a fault (" + f.Fault + "); it is validated once that is gone")
		}
		// A reset first: the validation follows it.
		st.ValidateOnly = false
		t.emit(KindStarted, false, "needs a GPU reset (%s) before its validation; it is reset once no pod holds it", f.Fault)
	} else if !st.ValidateOnly && !needsReset {
		if f.Unhealthy {
			t.emit(KindCancelled, true, "the GPU now has a fault a GPU reset does not clear (%s); remediation leaves it", f.Fault)
		} else {
			t.emit(KindCancelled, false, "the fault cleared before the reset (someone reset the GPU, or the node rebooted)")
		}
		*st = State{Attempts: st.Attempts}
		return done
	}
	if f.Drained {
		if st.Phase != PhaseBlocked {
			t.enter(PhaseBlocked, "an administrator drained the GPU")
			st.Evict = false
			t.emit(KindBlocked, false, "remediation paused: an administrator drained the GPU; `gpuhealth undrain` resumes it")
		}
		return done
	}
	if st.Phase == PhaseBlocked {
		t.enter(PhaseWaitingForPods, "")
		return again
	}
	if t.now.Before(m.notBefore[dev.UUID]) {
		return done
	}
	delete(m.notBefore, dev.UUID)
	holders, err := m.env.Holders(t.ctx, dev, t.in.migs)
	if err != nil {
		// Not knowing who holds the GPU is never a reason to reset it.
		return t.wait("cannot tell whether a pod holds the GPU: " + err.Error())
	}
	if len(holders) > 0 {
		t.waitHeld("held by "+strings.Join(holders, ", "), "waiting for the pods holding the GPU to end: "+strings.Join(holders, ", "))
		if m.cfg.EvictAfter > 0 && !st.Evict && t.now.Sub(st.Since) >= m.cfg.EvictAfter {
			st.Evict = true
			t.emit(KindEvicting, true, "the pods holding the GPU did not end within %v: asking for their eviction (NoExecute)", m.cfg.EvictAfter)
		}
		return done
	}
	st.Evict = false
	if st.ValidateOnly {
		// No reset: the operator's components may keep the GPU (DCGM runs the test).
		if st.Phase == PhaseWaitingForPods {
			t.enter(PhaseWaitingForSlot, "")
		}
		return t.takeSlot(nil, nil)
	}
	// The GPU operator's components hold every GPU of the node through NVML: without the
	// user's leave to pause them, the GPU waits, saying so (a reset would fail).
	ce, _ := m.env.(ComponentEnv)
	var running []Component
	if ce != nil {
		if running, err = ce.Components(t.ctx); err != nil {
			return t.wait("cannot tell whether the GPU operator's components hold the GPU: " + err.Error())
		}
		if len(running) > 0 && !m.cfg.PauseComponents {
			msg := "held by the GPU operator's components " + DescribeComponents(running)
			t.waitHeld(msg, msg+": a GPU reset fails while they hold the GPU; set remediation.pauseOperatorComponents to let remediation pause them for the reset")
			return done
		}
	}
	if st.Phase == PhaseWaitingForPods {
		t.enter(PhaseWaitingForSlot, "")
	}
	return t.takeSlot(ce, running)
}

// takeSlot takes a cluster-wide slot for the reset, then pauses the GPU operator's components
// that still run (running) or starts the reset.
func (t *transition) takeSlot(ce ComponentEnv, running []Component) next {
	m, dev := t.m, t.dev
	if m.resetInFlight(dev.UUID) {
		t.st.Message = "the previous reset has not returned yet"
		t.later()
		return done
	}
	if n, ok := t.holdSlot("cannot take a remediation slot", "waiting for a cluster-wide remediation slot"); !ok {
		return n
	}
	if t.st.ValidateOnly {
		t.enter(PhaseValidating, "")
		return again
	}
	if len(running) == 0 {
		return t.beginReset("resetting the GPU")
	}
	labels := make([]string, 0, len(running))
	for _, c := range running {
		labels = append(labels, c.Label)
	}
	changed, err := ce.PauseComponents(t.ctx, labels)
	if err != nil {
		m.release(t.ctx, dev.UUID)
		return t.wait("cannot pause the GPU operator's components: " + err.Error())
	}
	m.pausedFor = dev
	t.enter(PhasePausingComponents, "waiting for the GPU operator's components to leave: "+DescribeComponents(running))
	if len(changed) > 0 {
		t.emit(KindPausedComponents, false, "paused the GPU operator's components for the reset (%s set to %s; restored after it): %s",
			strings.Join(changed, ", "), ComponentPausedValue, DescribeComponents(running))
	}
	return done
}

// pausingComponents: the slot is held and the GPU operator's components were asked to leave;
// the reset starts once they have, and the attempt fails if they never do.
func (t *transition) pausingComponents() next {
	m, st, f, dev := t.m, t.st, t.f, t.dev
	if !f.NeedsReset || f.Drained {
		// Back to the waiting phases, which cancel or block; the slot is given back, and the
		// components come back at the end of the step.
		m.release(t.ctx, dev.UUID)
		t.enter(PhaseWaitingForPods, "")
		return again
	}
	if t.now.Before(m.notBefore[dev.UUID]) && t.now.Sub(st.Since) < m.cfg.ResetTimeout {
		return done // the pods are asked about again after Recheck
	}
	t.later()
	ce, _ := m.env.(ComponentEnv)
	var running []Component
	var err error
	if ce != nil {
		running, err = ce.Components(t.ctx)
	}
	if err == nil && len(running) == 0 {
		delete(m.notBefore, dev.UUID)
		return t.beginReset("the GPU operator's components have left; resetting the GPU")
	}
	if t.now.Sub(st.Since) >= m.cfg.ResetTimeout {
		// Counted as an attempt: the components may never leave.
		st.Attempts = append(st.Attempts, t.now)
		why := "the GPU operator's components did not leave within " + m.cfg.ResetTimeout.String()
		if err != nil {
			why += ": " + err.Error()
		} else {
			why += ": " + DescribeComponents(running)
		}
		t.fail(why)
	}
	return done
}

// resetting: the reset is done once the command returned and the backend reported it.
func (t *transition) resetting() next {
	m, st, f, in := t.m, t.st, t.f, t.in
	if st.Interrupted {
		// The agent restarted during the reset: its outcome is unknown. A GPU without the fault
		// was reset (and the checkpoint saw it); one with the fault was not.
		st.Interrupted = false
		if f.Unhealthy {
			t.fail("the agent restarted during the reset and the fault is still there")
			return done
		}
		st.ResetDone, st.ResetObserved = true, true
	}
	if in.finished {
		if in.result != nil {
			t.fail("the reset failed: " + in.result.Error())
			return done
		}
		st.ResetDone = true
	}
	if in.observed && !in.observedAt.Before(st.Since) {
		st.ResetObserved, st.ResetSeenAt = true, in.observedAt
	}
	if st.ResetDone && st.ResetObserved && m.cfg.Validate {
		t.enter(PhaseValidating, "")
		t.emit(KindResetObserved, false, "the GPU was reset; an active test of it decides whether it goes back into service")
		return again
	}
	if st.ResetDone && st.ResetObserved {
		t.enter(PhaseProbation, "")
		t.emit(KindResetObserved, false, "the GPU was reset; it must stay healthy for %v before it goes back into service", m.cfg.Probation)
		return again
	}
	if t.now.Sub(st.Since) >= m.cfg.ResetTimeout {
		why := "the reset command did not finish"
		if st.ResetDone {
			why = "the backend did not report the reset"
		}
		t.fail(fmt.Sprintf("%s within %v", why, m.cfg.ResetTimeout))
	}
	return done
}

// probation: the GPU must stay healthy for a while after its reset before it is back in service.
func (t *transition) probation() next {
	m, st, f, now := t.m, t.st, t.f, t.now
	// Any fault fails the probation, also one a reset would not clear (that one then ends the
	// repair: the GPU is left to what its condition recommends).
	if f.Unhealthy && t.in.snapTime.After(st.ResetSeenAt) {
		t.fail(fmt.Sprintf("the fault came back %v after the reset: %s", now.Sub(st.Since).Round(time.Second), f.Fault))
		return done
	}
	probation := m.cfg.Probation
	if st.Validated {
		probation = m.cfg.ValidationProbation
	}
	if now.Sub(st.Since) < probation {
		return done
	}
	if st.Validated {
		return t.backInService(fmt.Sprintf("the GPU passed its validation and stayed healthy for %v and is back in service", probation))
	}
	return t.backInService(fmt.Sprintf("the GPU stayed healthy for %v after its reset and is back in service (passive: no validation configured, nothing tested it)", probation))
}

// backInService ends the repair (why says how the GPU came back): the slot is given back and
// the GPU returns to service through the normal path. A return no test judged says so
// (passive), for the GPU's history.
func (t *transition) backInService(why string) next {
	st := t.st
	t.m.release(t.ctx, t.dev.UUID)
	d := t.now.Sub(st.FaultSince)
	e := Event{Device: t.dev, Kind: KindRepaired, Duration: d, Message: fmt.Sprintf("%s, %v after the repair began", why, d.Round(time.Second))}
	if !st.Validated {
		e.Validation, e.By = health.ValidationPassive, "probation"
	}
	t.events = append(t.events, e)
	*st = State{Attempts: st.Attempts}
	return done
}

// failed: remediation gave up; a GPU that recovers by other means starts afresh.
func (t *transition) failed() next {
	// A GPU that failed its validations has no fault of its own to lose: it stays out until a
	// reboot, or an operator's request to validate it again.
	if !t.f.Unhealthy && t.st.FailReason != ReasonValidationFailed {
		t.emit(KindCancelled, false, "the GPU recovered without remediation (reset or reboot by someone else)")
		*t.st = State{}
	}
	return done
}

func (m *Machine) release(ctx context.Context, uuid string) {
	// A slot that cannot be released expires by itself (see Budget).
	_ = m.env.ReleaseSlot(ctx, uuid)
}
