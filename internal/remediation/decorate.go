package remediation

import (
	"slices"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// ConditionRemediation is the type of the condition Decorate adds to a GPU under repair.
const ConditionRemediation health.ConditionType = "Remediation"

// Reasons of ConditionRemediation.
const (
	ReasonResetting         = "RemediationResetting"
	ReasonValidating        = "RemediationValidating"
	ReasonProbation         = "RemediationProbation"
	ReasonRemediationFailed = "RemediationFailed"
	// ReasonValidationFailed: the GPU failed its validation; waiting for another reset, or
	// given up on (recommended action rebootNode).
	ReasonValidationFailed = gpuhealthv1.ReasonValidationFailed
)

// Decorate returns snap as the reporters must see it while GPUs are under repair: a GPU being
// reset, validated or on probation, waiting for its validation, or waiting for another reset
// after a failed one stays Unhealthy (its own conditions cleared with the reset, but it goes
// back into service only after probation), a GPU remediation gave up on is Unhealthy with reason
// RemediationFailed, and a GPU whose holders' grace period ran out asks for eviction. MIG
// instances follow their GPU. snap itself is not changed.
func Decorate(snap health.Snapshot, states map[string]State) health.Snapshot {
	if len(states) == 0 {
		return snap
	}
	out := snap
	out.Devices = slices.Clone(snap.Devices)
	for i := range out.Devices {
		d := &out.Devices[i]
		uuid := d.Device.UUID
		if d.Device.MIG != nil {
			uuid = d.Device.MIG.ParentUUID
		}
		st, ok := states[uuid]
		if !ok {
			continue
		}
		if st.Evict {
			d.Evict = true
		}
		var c health.Condition
		switch {
		case st.Phase == PhaseResetting:
			c = health.Condition{Reason: ReasonResetting, Message: "the GPU is being reset", RecommendedAction: health.ActionNone}
		case st.Phase == PhaseValidating:
			c = health.Condition{Reason: ReasonValidating, Message: "the GPU is being validated (an active test) before it goes back into service", RecommendedAction: health.ActionNone}
		case st.Phase == PhaseProbation && st.Validated:
			c = health.Condition{Reason: ReasonProbation, Message: "the GPU passed its validation and is on probation", RecommendedAction: health.ActionNone}
		case st.Phase == PhaseProbation:
			c = health.Condition{Reason: ReasonProbation, Message: "the GPU was reset and is on probation", RecommendedAction: health.ActionNone}
		case st.Phase == PhaseFailed && st.FailReason == ReasonValidationFailed:
			c = health.Condition{Reason: ReasonValidationFailed, Message: st.Message, RecommendedAction: health.ActionRebootNode}
		case st.Phase == PhaseFailed:
			c = health.Condition{Reason: ReasonRemediationFailed, Message: st.Message, RecommendedAction: health.ActionRebootNode}
		case st.ValidationFailed:
			// Waiting for another reset: nothing of its own says the GPU is sick any more.
			c = health.Condition{Reason: ReasonValidationFailed, Message: "the GPU failed its validation and waits for another reset: " + st.Message, RecommendedAction: health.ActionResetGPU}
		case st.ValidateOnly:
			c = health.Condition{Reason: ReasonValidating, Message: "the GPU waits for its validation (" + st.Requested + ") before it goes back into service", RecommendedAction: health.ActionNone}
		default:
			continue
		}
		c.Type, c.Severity, c.ClearsOn, c.Since, c.LastSeen = ConditionRemediation, health.Unhealthy, health.ClearsOnAdmin, st.Since, st.Since
		d.Conditions = append(slices.Clone(d.Conditions), c)
		d.Health = health.Unhealthy
	}
	return out
}
