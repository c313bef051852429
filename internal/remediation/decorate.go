package remediation

import (
	"slices"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// ConditionRemediation is the type of the condition Decorate adds to a GPU under repair.
const ConditionRemediation health.ConditionType = "Remediation"

// Reasons of ConditionRemediation.
const (
	ReasonResetting         = "RemediationResetting"
	ReasonProbation         = "RemediationProbation"
	ReasonRemediationFailed = "RemediationFailed"
)

// Decorate returns snap as the reporters must see it while GPUs are under repair: a GPU being
// reset or on probation stays Unhealthy (its own conditions cleared with the reset, but it goes
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
		switch st.Phase {
		case PhaseResetting:
			c = health.Condition{Reason: ReasonResetting, Message: "the GPU is being reset", RecommendedAction: health.ActionNone}
		case PhaseProbation:
			c = health.Condition{Reason: ReasonProbation, Message: "the GPU was reset and is on probation", RecommendedAction: health.ActionNone}
		case PhaseFailed:
			c = health.Condition{Reason: ReasonRemediationFailed, Message: st.Message, RecommendedAction: health.ActionRebootNode}
		default:
			continue
		}
		c.Type, c.Severity, c.ClearsOn, c.Since, c.LastSeen = ConditionRemediation, health.Unhealthy, health.ClearsOnAdmin, st.Since, st.Since
		d.Conditions = append(slices.Clone(d.Conditions), c)
		d.Health = health.Unhealthy
	}
	return out
}
