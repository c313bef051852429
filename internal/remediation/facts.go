package remediation

import (
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Facts are what a snapshot says about one GPU.
type Facts struct {
	// Unhealthy: the GPU has an Unhealthy condition of its own (not a drain, not remediation's).
	Unhealthy bool
	// NeedsReset: the GPU is Unhealthy, and every Unhealthy condition clears on a GPU reset and
	// recommends one (resetGPU, drainAndResetGPU, resetBus): its effective action is a reset.
	NeedsReset bool
	// Fault names the Unhealthy conditions.
	Fault string
	// Drained: an administrator drained the GPU.
	Drained bool
}

// resetActions are the recommended actions a GPU reset carries out.
var resetActions = []health.Action{health.ActionResetGPU, health.ActionDrainAndResetGPU, health.ActionResetBus}

// FactsOf reads the facts from a whole GPU's status. Conditions the machine adds itself
// (Decorate) do not count.
func FactsOf(d health.DeviceStatus) Facts {
	var f Facts
	var faults []string
	resettable := true
	for _, c := range d.Conditions {
		if c.Type == ConditionRemediation {
			continue
		}
		if c.Type == health.ConditionAdmin {
			f.Drained = true
			continue
		}
		if c.Severity != health.Unhealthy {
			continue
		}
		if c.ClearsOn != health.ClearsOnGPUReset || !slices.Contains(resetActions, c.RecommendedAction) {
			resettable = false
		}
		faults = append(faults, c.Reason)
	}
	f.Unhealthy = len(faults) > 0
	f.NeedsReset = resettable && f.Unhealthy
	f.Fault = strings.Join(faults, ", ")
	return f
}
