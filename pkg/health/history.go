package health

import (
	"fmt"
	"strings"
	"time"
)

// HistoryKind says what a HistoryEntry records.
type HistoryKind string

// What a GPU's history records.
const (
	// HistoryFault: the GPU became Unhealthy; Reason is the fault's.
	HistoryFault HistoryKind = "fault"
	// HistoryReset: the GPU was reset.
	HistoryReset HistoryKind = "reset"
	// HistoryReboot: the node rebooted while the GPU had a fault the reboot was to repair.
	HistoryReboot HistoryKind = "reboot"
	// HistoryCleared: an administrator cleared the GPU's conditions; nothing before counts
	// towards escalation any more (the card was inspected or replaced).
	HistoryCleared HistoryKind = "cleared"
	// HistoryValidation: the GPU's return to service after a repair was judged; Reason is the
	// ValidationResult and By what judged it. It is neither a fault nor a repair: escalation
	// does not count it.
	HistoryValidation HistoryKind = "validation"
)

// ValidationResult is how a repaired GPU's return to service was judged.
type ValidationResult string

// Validation results, as a GPU's history and its report carry them.
const (
	// ValidationPassed: an active test of the GPU passed.
	ValidationPassed ValidationResult = "passed"
	// ValidationFailed: an active test of the GPU failed; it stayed out of service.
	ValidationFailed ValidationResult = "failed"
	// ValidationPassive: nothing tested the GPU; it went back after a probation without a
	// fault (no validation configured), so nothing reads as tested that was not.
	ValidationPassive ValidationResult = "passive"
)

// HistoryEntry is one event of a GPU's life that outlives its conditions.
type HistoryEntry struct {
	Time   time.Time   `json:"time"`
	Kind   HistoryKind `json:"kind"`
	Reason string      `json:"reason,omitempty"`
	// By says what judged a HistoryValidation ("dcgm: dcgmi diag -r 2", "probation").
	By string `json:"by,omitempty"`
}

// LastValidation returns the newest HistoryValidation entry of a history, if any.
func LastValidation(h []HistoryEntry) (HistoryEntry, bool) {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Kind == HistoryValidation {
			return h[i], true
		}
	}
	return HistoryEntry{}, false
}

// MaxHistory bounds each GPU's history: the oldest entries go first.
const MaxHistory = 32

// Escalation to replacing a GPU: a GPU whose fault keeps returning soon after each repair (a
// reset or a reboot) needs a new card, not another repair.
const (
	// ConditionReplaceGPU is raised, Unhealthy until an administrator clears it, when a fault
	// returned within the window after Returns repairs.
	ConditionReplaceGPU ConditionType = "ReplaceGPU"
	// ReasonFaultReturnsAfterRepair is its reason.
	ReasonFaultReturnsAfterRepair = "FaultReturnsAfterRepair"
	// ActionReplaceGPU is its recommended action: remediation never resets such a GPU.
	ActionReplaceGPU Action = "replaceGPU"
)

// Escalation defaults: gpud escalates to hardware inspection after two reboots
// (DefaultRebootThreshold); a fault back within a day of its repair is the same fault.
const (
	DefaultEscalationReturns = 2
	DefaultEscalationWindow  = 24 * time.Hour
)

// EscalationPolicy configures escalation to ConditionReplaceGPU.
type EscalationPolicy struct {
	Enabled bool
	// Returns is how many times a fault must come back within Window of a repair.
	Returns int
	Window  time.Duration
}

// record appends an entry to a physical GPU's history, dropping the oldest beyond MaxHistory.
func (ds *deviceState) record(e HistoryEntry) {
	if len(ds.history) >= MaxHistory {
		ds.history = append(ds.history[:0], ds.history[len(ds.history)-MaxHistory+1:]...)
	}
	ds.history = append(ds.history, e)
}

// faultPending reports whether the GPU's last fault has had no repair since.
func (ds *deviceState) faultPending() bool {
	for i := len(ds.history) - 1; i >= 0; i-- {
		switch ds.history[i].Kind {
		case HistoryFault:
			return true
		case HistoryReset, HistoryReboot, HistoryCleared:
			return false
		case HistoryValidation:
			// A GPU that failed its validation is not repaired, whatever its conditions say.
			if e := ds.history[i]; e.Reason == string(ValidationFailed) {
				return true
			}
		}
	}
	return false
}

// returns lists the faults that came back within window of a repair, since the last time an
// administrator cleared the GPU, as "XID48 after the reset at 2026-...".
func (ds *deviceState) returns(window time.Duration) []string {
	var out []string
	pending := false
	var repair *HistoryEntry
	for i := range ds.history {
		e := &ds.history[i]
		switch e.Kind {
		case HistoryCleared:
			out, pending, repair = nil, false, nil
		case HistoryFault:
			if repair != nil && e.Time.Sub(repair.Time) >= 0 && e.Time.Sub(repair.Time) <= window {
				out = append(out, fmt.Sprintf("%s %v after the %s at %s", e.Reason, e.Time.Sub(repair.Time).Round(time.Second), repair.Kind, repair.Time.UTC().Format(time.RFC3339)))
			}
			pending, repair = true, nil
		case HistoryReset, HistoryReboot:
			if pending {
				repair, pending = e, false
			}
		}
	}
	return out
}

// fault records, on a physical GPU, an Unhealthy condition that needs a repair (a sticky one:
// polled readings that recover on their own are not the card's faults), unless a fault is
// already pending since the last repair; and escalates it to ConditionReplaceGPU when the GPU's
// faults keep returning after repairs. Drains and escalation itself are not faults of the card.
func (ev *evaluation) fault(gpu *deviceState, c Condition) {
	if ev.restoring || c.Type == ConditionAdmin || c.Type == ConditionReplaceGPU || gpu.faultPending() {
		return
	}
	gpu.record(HistoryEntry{Time: ev.now, Kind: HistoryFault, Reason: c.Reason})
	esc := ev.t.policy.Escalation
	if !esc.Enabled || esc.Returns < 1 {
		return
	}
	back := gpu.returns(esc.Window)
	if len(back) < esc.Returns {
		return
	}
	ev.raise(gpu, raiseSpec{
		Type: ConditionReplaceGPU, Severity: Unhealthy, ClearsOn: ClearsOnAdmin,
		RecommendedAction: ActionReplaceGPU, Reason: ReasonFaultReturnsAfterRepair,
	}, func() string {
		return fmt.Sprintf("the GPU's faults returned %d times within %v of a repair (%s): replace it rather than repair it again; `gpuhealth clear` once it is replaced or inspected",
			len(back), esc.Window, strings.Join(back, "; "))
	})
}

// recordRepair records a reset or reboot of a physical GPU. A reboot is recorded only when it
// repairs a fault, so that a GPU's history is its faults and what was done about them.
func (ds *deviceState) recordRepair(kind HistoryKind, at time.Time) {
	if kind == HistoryReboot && !ds.faultPending() {
		return
	}
	if n := len(ds.history); n > 0 && ds.history[n-1].Kind == kind {
		ds.history[n-1].Time = at // repairs with no fault between are one repair, the latest
		return
	}
	ds.record(HistoryEntry{Time: at, Kind: kind})
}
