package remediation

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

// The transitions of a GPU's validation (Config.Validate): an operator's request, the
// Validating phase and its verdicts. See the package comment for the picture.

// Validation backoff: a run that gave no verdict (the host engine down, a timeout, output that
// does not parse) is run again after a minute, doubling up to half an hour; the GPU stays out.
const (
	ValidationRetryFirst = time.Minute
	ValidationRetryMax   = 30 * time.Minute
)

// requested applies an operator's request for a validation: an idle GPU starts one; a GPU
// under repair is validated at its end anyway (with validation on), and the Event says so.
func (t *transition) requested(why string) {
	st := t.st
	// A GPU given up on after failed validations is tested again on request: nothing else
	// brings it back but a reboot.
	retry := st.Phase == PhaseFailed && st.FailReason == ReasonValidationFailed && !t.f.Unhealthy
	if st.Phase != PhaseIdle && !retry {
		t.emit(KindWaiting, false, "validation requested %s: the GPU is under repair (%s) and is validated before it goes back into service", why, st.Phase)
		return
	}
	*st = State{Attempts: st.Attempts, ValidateOnly: true, Requested: why, FaultSince: t.now, Fault: "validation requested " + why}
	t.enter(PhaseWaitingForPods, "")
	t.emit(KindStarted, false, "validation requested %s: the GPU is kept out of service until it passes; it is tested once no pod holds it", why)
}

// validating: the GPU is tested, one GPU of the node at a time; a fault seen meanwhile fails
// the test at once, as the strongest evidence the agent has.
func (t *transition) validating() next {
	m, st, f, in, dev := t.m, t.st, t.f, t.in, t.dev
	if in.judged {
		return t.judge(in.verdict)
	}
	running := m.validationRunning()
	if f.Unhealthy && in.snapTime.After(st.ResetSeenAt) && in.snapTime.After(st.Since) {
		if running == dev.UUID {
			// The verdict that comes back later finds the GPU in another phase: dropped.
			t.emit(KindValidationFailed, true, "a fault during the validation: %s", f.Fault)
		}
		t.validationFailed("a fault during the validation: " + f.Fault)
		return done
	}
	if running == dev.UUID || t.now.Before(m.notBefore[dev.UUID]) {
		return done
	}
	if running != "" {
		t.st.Message = "waiting for the validation of GPU " + running + " to end: the host engine runs one diagnostic at a time"
		t.later()
		return done
	}
	// The slot was taken before the reset, and may have expired during a long run or retries.
	if n, ok := t.holdSlot("cannot confirm the remediation slot for the validation", "waiting for a cluster-wide remediation slot for the validation"); !ok {
		return n
	}
	delete(m.notBefore, dev.UUID)
	if m.startValidation(dev) {
		why := "after its reset"
		if st.ValidateOnly {
			why = st.Requested
		}
		st.Message = "an active test of the GPU runs"
		t.emit(KindValidationStarted, false, "validating the GPU %s: it goes back into service only if the test passes", why)
	}
	return done
}

// holdSlot takes the GPU's cluster-wide remediation slot, or confirms the one it holds (a slot
// may expire during a long run). Without one the GPU waits, saying so: cannot and the error
// when the slots could not be read, waiting when none is free; ok is false and n is what the
// transition returns.
func (t *transition) holdSlot(cannot, waiting string) (n next, ok bool) {
	ok, err := t.m.env.TakeSlot(t.ctx, t.dev.UUID)
	if err != nil {
		return t.wait(cannot + ": " + err.Error()), false
	}
	if !ok {
		return t.wait(waiting), false
	}
	return done, true
}

// judge acts on a validation's verdict.
func (t *transition) judge(v verdict) next {
	m, st := t.m, t.st
	e := Event{Device: t.dev, Duration: v.took, By: m.cfg.ValidatedBy}
	switch v.Result {
	case validation.Passed:
		e.Kind, e.Validation = KindValidationPassed, health.ValidationPassed
		e.Message = "the GPU passed its validation (" + v.took.Round(time.Second).String() + "): " + v.Message
		if len(v.Warnings) > 0 {
			e.Message += "; findings that are not faults: " + strings.Join(v.Warnings, "; ")
		}
		t.events = append(t.events, e)
		st.Validated, st.ValidationFailed, st.ValidationErrors = true, false, 0
		if m.cfg.ValidationProbation <= 0 {
			return t.backInService("the GPU passed its validation and is back in service")
		}
		t.enter(PhaseProbation, "passed its validation; on probation")
		return done
	case validation.Failed:
		e.Kind, e.Validation, e.Warning = KindValidationFailed, health.ValidationFailed, true
		e.Message = "the GPU failed its validation: " + v.Message
		t.events = append(t.events, e)
		t.validationFailed("failed its validation: " + v.Message)
		return done
	default:
		st.ValidationErrors++
		delay := ValidationRetryFirst
		for i := 1; i < st.ValidationErrors && delay < ValidationRetryMax; i++ {
			delay *= 2
		}
		delay = min(delay, ValidationRetryMax)
		m.notBefore[t.dev.UUID] = t.now.Add(delay)
		st.Message = "could not validate the GPU: " + v.Message
		e.Kind, e.Warning = KindValidationError, true
		e.Message = fmt.Sprintf("could not validate the GPU (no verdict, nothing counted): %s; it stays out of service and is tested again in %v", v.Message, delay)
		t.events = append(t.events, e)
		return done
	}
}

// validationFailed ends the attempt of a GPU that failed its validation: it needs another
// reset, and counts towards maxAttempts (a validation alone counts as an attempt of its own).
func (t *transition) validationFailed(why string) {
	st := t.st
	st.ValidationFailed = true
	if st.ValidateOnly {
		st.ValidateOnly = false
		st.Attempts = append(st.Attempts, t.now)
	}
	t.failBecause(ReasonValidationFailed, why)
}
