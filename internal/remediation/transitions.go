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
}

func (m *Machine) step(ctx context.Context, dev health.Device, st *State, in input, now time.Time, events []Event) []Event {
	emit := func(kind EventKind, warning bool, format string, args ...any) {
		events = append(events, Event{Device: dev, Kind: kind, Warning: warning, Message: fmt.Sprintf(format, args...)})
	}
	enter := func(p Phase, msg string) {
		st.Phase, st.Since, st.Message = p, now, msg
	}
	st.Attempts = slices.DeleteFunc(st.Attempts, func(a time.Time) bool { return now.Sub(a) >= m.cfg.Window })
	f := in.facts
	fail := func(why string) {
		if st.HoldsSlot() {
			m.release(ctx, dev.UUID)
		}
		st.ResetDone, st.ResetObserved, st.Interrupted, st.Evict, st.ResetSeenAt = false, false, false, false, time.Time{}
		if len(st.Attempts) >= m.cfg.MaxAttempts {
			emit(KindAttemptFailed, true, "reset attempt %d of %d failed: %s", len(st.Attempts), m.cfg.MaxAttempts, why)
			enter(PhaseFailed, fmt.Sprintf("gave up after %d resets within %v; last: %s", len(st.Attempts), m.cfg.Window, why))
			emit(KindGaveUp, true, "%s: the GPU stays out of service; reboot or power-cycle the node, or replace the GPU", st.Message)
			return
		}
		// The next attempt waits, longer after each failure: what made this one fail (another
		// process holding the GPU, a driver busy with something else) rarely ends at once, and
		// attempts in quick succession would use up maxAttempts in seconds.
		delay := m.retryDelay(len(st.Attempts))
		m.notBefore[dev.UUID] = now.Add(delay)
		emit(KindAttemptFailed, true, "reset attempt %d of %d failed: %s; the next attempt in %v", len(st.Attempts), m.cfg.MaxAttempts, why, delay)
		enter(PhaseWaitingForPods, why)
	}

	// A few transitions can follow one another at one instant (a fault on an idle GPU with a
	// free slot goes straight to the reset); each pass either returns or changes the phase.
	for range 4 {
		switch st.Phase {
		case PhaseIdle:
			if !f.NeedsReset {
				return events
			}
			if len(st.Attempts) >= m.cfg.MaxAttempts {
				enter(PhaseFailed, fmt.Sprintf("%s again after %d resets within %v", f.Fault, len(st.Attempts), m.cfg.Window))
				st.Fault = f.Fault
				emit(KindGaveUp, true, "%s: the GPU stays out of service; reboot or power-cycle the node, or replace the GPU", st.Message)
				return events
			}
			st.FaultSince, st.Fault = now, f.Fault
			enter(PhaseWaitingForPods, "")
			emit(KindStarted, false, "needs a GPU reset (%s); it is reset once no pod holds it", f.Fault)

		case PhaseWaitingForPods, PhaseWaitingForSlot, PhaseBlocked:
			if !f.NeedsReset {
				if f.Unhealthy {
					emit(KindCancelled, true, "the GPU now has a fault a GPU reset does not clear (%s); remediation leaves it", f.Fault)
				} else {
					emit(KindCancelled, false, "the fault cleared before the reset (someone reset the GPU, or the node rebooted)")
				}
				*st = State{Attempts: st.Attempts}
				return events
			}
			if f.Drained {
				if st.Phase != PhaseBlocked {
					enter(PhaseBlocked, "an administrator drained the GPU")
					st.Evict = false
					emit(KindBlocked, false, "remediation paused: an administrator drained the GPU; `gpuhealth undrain` resumes it")
				}
				return events
			}
			if st.Phase == PhaseBlocked {
				enter(PhaseWaitingForPods, "")
				continue
			}
			if now.Before(m.notBefore[dev.UUID]) {
				return events
			}
			delete(m.notBefore, dev.UUID)
			later := func() { m.notBefore[dev.UUID] = now.Add(m.cfg.Recheck) }
			// wait records why the GPU waits and says it once per reason (an Event, the log and
			// the events metric through the controller): nothing waits silently.
			wait := func(msg string) []Event {
				later()
				if msg != st.Message {
					st.Message = msg
					emit(KindWaiting, false, "%s", msg)
				}
				return events
			}
			holders, err := m.env.Holders(ctx, dev, in.migs)
			if err != nil {
				// Not knowing who holds the GPU is never a reason to reset it.
				return wait("cannot tell whether a pod holds the GPU: " + err.Error())
			}
			if len(holders) > 0 {
				later()
				if st.Phase != PhaseWaitingForPods {
					enter(PhaseWaitingForPods, "")
				}
				msg := "held by " + strings.Join(holders, ", ")
				if msg != st.Message {
					st.Message = msg
					emit(KindWaiting, false, "waiting for the pods holding the GPU to end: %s", strings.Join(holders, ", "))
				}
				if m.cfg.EvictAfter > 0 && !st.Evict && now.Sub(st.Since) >= m.cfg.EvictAfter {
					st.Evict = true
					emit(KindEvicting, true, "the pods holding the GPU did not end within %v: asking for their eviction (NoExecute)", m.cfg.EvictAfter)
				}
				return events
			}
			st.Evict = false
			// The GPU operator's components hold every GPU of the node through NVML: without
			// the user's leave to pause them, the GPU waits, saying so (a reset would fail).
			ce, _ := m.env.(ComponentEnv)
			var running []Component
			if ce != nil {
				if running, err = ce.Components(ctx); err != nil {
					return wait("cannot tell whether the GPU operator's components hold the GPU: " + err.Error())
				}
				if len(running) > 0 && !m.cfg.PauseComponents {
					later()
					if st.Phase != PhaseWaitingForPods {
						enter(PhaseWaitingForPods, "")
					}
					msg := "held by the GPU operator's components " + DescribeComponents(running)
					if msg != st.Message {
						st.Message = msg
						emit(KindWaiting, false, "%s: a GPU reset fails while they hold the GPU; set remediation.pauseOperatorComponents to let remediation pause them for the reset", msg)
					}
					return events
				}
			}
			if st.Phase == PhaseWaitingForPods {
				enter(PhaseWaitingForSlot, "")
			}
			if m.resetInFlight(dev.UUID) {
				st.Message = "the previous reset has not returned yet"
				later()
				return events
			}
			ok, err := m.env.TakeSlot(ctx, dev.UUID)
			if err != nil {
				return wait("cannot take a remediation slot: " + err.Error())
			}
			if !ok {
				return wait("waiting for a cluster-wide remediation slot")
			}
			if len(running) > 0 {
				labels := make([]string, 0, len(running))
				for _, c := range running {
					labels = append(labels, c.Label)
				}
				changed, err := ce.PauseComponents(ctx, labels)
				if err != nil {
					m.release(ctx, dev.UUID)
					return wait("cannot pause the GPU operator's components: " + err.Error())
				}
				m.pausedFor = dev
				enter(PhasePausingComponents, "waiting for the GPU operator's components to leave: "+DescribeComponents(running))
				if len(changed) > 0 {
					emit(KindPausedComponents, false, "paused the GPU operator's components for the reset (%s set to %s; restored after it): %s",
						strings.Join(changed, ", "), ComponentPausedValue, DescribeComponents(running))
				}
				return events
			}
			st.Attempts = append(st.Attempts, now)
			enter(PhaseResetting, "")
			st.ResetDone, st.ResetObserved, st.Interrupted, st.ResetSeenAt = false, false, false, time.Time{}
			emit(KindResetStarted, false, "resetting the GPU (attempt %d of %d)", len(st.Attempts), m.cfg.MaxAttempts)
			m.startReset(dev)
			return events

		case PhasePausingComponents:
			if !f.NeedsReset || f.Drained {
				// Back to the waiting phases, which cancel or block; the slot is given back, and
				// the components come back at the end of the step.
				m.release(ctx, dev.UUID)
				enter(PhaseWaitingForPods, "")
				continue
			}
			if now.Before(m.notBefore[dev.UUID]) && now.Sub(st.Since) < m.cfg.ResetTimeout {
				return events // the pods are asked about again after Recheck
			}
			m.notBefore[dev.UUID] = now.Add(m.cfg.Recheck)
			ce, _ := m.env.(ComponentEnv)
			var running []Component
			var err error
			if ce != nil {
				running, err = ce.Components(ctx)
			}
			if err == nil && len(running) == 0 {
				delete(m.notBefore, dev.UUID)
				st.Attempts = append(st.Attempts, now)
				enter(PhaseResetting, "")
				st.ResetDone, st.ResetObserved, st.Interrupted, st.ResetSeenAt = false, false, false, time.Time{}
				emit(KindResetStarted, false, "the GPU operator's components have left; resetting the GPU (attempt %d of %d)", len(st.Attempts), m.cfg.MaxAttempts)
				m.startReset(dev)
				return events
			}
			if now.Sub(st.Since) >= m.cfg.ResetTimeout {
				// Counted as an attempt: the components may never leave.
				st.Attempts = append(st.Attempts, now)
				why := "the GPU operator's components did not leave within " + m.cfg.ResetTimeout.String()
				if err != nil {
					why += ": " + err.Error()
				} else {
					why += ": " + DescribeComponents(running)
				}
				fail(why)
			}
			return events

		case PhaseResetting:
			if st.Interrupted {
				// The agent restarted during the reset: its outcome is unknown. A GPU without the
				// fault was reset (and the checkpoint saw it); one with the fault was not.
				st.Interrupted = false
				if f.Unhealthy {
					fail("the agent restarted during the reset and the fault is still there")
					return events
				}
				st.ResetDone, st.ResetObserved = true, true
			}
			if in.finished {
				if in.result != nil {
					fail("the reset failed: " + in.result.Error())
					return events
				}
				st.ResetDone = true
			}
			if in.observed && !in.observedAt.Before(st.Since) {
				st.ResetObserved, st.ResetSeenAt = true, in.observedAt
			}
			if st.ResetDone && st.ResetObserved {
				enter(PhaseProbation, "")
				emit(KindResetObserved, false, "the GPU was reset; it must stay healthy for %v before it goes back into service", m.cfg.Probation)
				continue
			}
			if now.Sub(st.Since) >= m.cfg.ResetTimeout {
				why := "the reset command did not finish"
				if st.ResetDone {
					why = "the backend did not report the reset"
				}
				fail(fmt.Sprintf("%s within %v", why, m.cfg.ResetTimeout))
			}
			return events

		case PhaseProbation:
			// Any fault fails the probation, also one a reset would not clear (that one then
			// ends the repair: the GPU is left to what its condition recommends).
			if f.Unhealthy && in.snapTime.After(st.ResetSeenAt) {
				fail(fmt.Sprintf("the fault came back %v after the reset: %s", now.Sub(st.Since).Round(time.Second), f.Fault))
				return events
			}
			if now.Sub(st.Since) < m.cfg.Probation {
				return events
			}
			m.release(ctx, dev.UUID)
			d := now.Sub(st.FaultSince)
			events = append(events, Event{Device: dev, Kind: KindRepaired, Duration: d,
				Message: fmt.Sprintf("the GPU stayed healthy for %v after its reset and is back in service, %v after the repair began", m.cfg.Probation, d.Round(time.Second))})
			*st = State{Attempts: st.Attempts}
			return events

		case PhaseFailed:
			if !f.Unhealthy {
				emit(KindCancelled, false, "the GPU recovered without remediation (reset or reboot by someone else)")
				*st = State{}
			}
			return events

		default:
			// A state file from a newer version: start over.
			*st = State{Attempts: st.Attempts}
		}
	}
	return events
}

func (m *Machine) release(ctx context.Context, uuid string) {
	// A slot that cannot be released expires by itself (see Budget).
	_ = m.env.ReleaseSlot(ctx, uuid)
}
