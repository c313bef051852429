package health

import (
	"fmt"
	"strconv"
)

// RecoveryAction is NVML's GPU recovery action (nvmlDeviceGpuRecoveryAction_t): what the driver
// says must happen before the GPU can be trusted again. Backends pass NVML's numeric value
// through, so a driver newer than this package may send a value that has no name here; the
// RecoveryAction check then fails safe (see recoveryRuleFor).
type RecoveryAction uint8

// Recovery actions, with NVML's numeric values (NVML_GPU_RECOVERY_ACTION_* in nvml.h).
const (
	RecoveryNone              RecoveryAction = 0 // NONE: no action needed
	RecoveryGPUReset          RecoveryAction = 1 // GPU_RESET
	RecoveryNodeReboot        RecoveryAction = 2 // NODE_REBOOT
	RecoveryDrainP2P          RecoveryAction = 3 // DRAIN_P2P
	RecoveryDrainAndReset     RecoveryAction = 4 // DRAIN_AND_RESET: drain P2P, then reset the GPU
	RecoveryRecoverIMEXDomain RecoveryAction = 5 // RECOVER_IMEX_DOMAIN
	RecoveryBusReset          RecoveryAction = 6 // BUS_RESET: reset the GPU's PCIe bus
	RecoverySystemReboot      RecoveryAction = 7 // SYSTEM_REBOOT
)

var recoveryActionNames = enumNames[RecoveryAction]{typ: "RecoveryAction", what: "recovery action", names: []string{
	RecoveryNone: "none", RecoveryGPUReset: "gpuReset", RecoveryNodeReboot: "nodeReboot",
	RecoveryDrainP2P: "drainP2P", RecoveryDrainAndReset: "drainAndReset",
	RecoveryRecoverIMEXDomain: "recoverIMEXDomain", RecoveryBusReset: "busReset",
	RecoverySystemReboot: "systemReboot",
}}

func (a RecoveryAction) String() string { return recoveryActionNames.String(a) }

// ParseRecoveryAction parses the name of one of NVML's recovery actions, as String writes it:
// none, gpuReset, nodeReboot, drainP2P, drainAndReset, recoverIMEXDomain, busReset or
// systemReboot.
func ParseRecoveryAction(s string) (RecoveryAction, error) { return recoveryActionNames.parse(s) }

// recoveryRule is the condition the RecoveryAction check raises for one action.
type recoveryRule struct {
	severity Severity
	clearsOn ClearsOn
	action   Action
	reason   string
}

// recoveryRules maps each action NVML names, but none, to its condition. Whatever it clears
// on, a condition of this check also ends when NVML reports none again.
var recoveryRules = [...]recoveryRule{
	RecoveryGPUReset:      {Unhealthy, ClearsOnGPUReset, ActionResetGPU, "RecoveryActionGPUReset"},
	RecoveryNodeReboot:    {Unhealthy, ClearsOnNodeReboot, ActionRebootNode, "RecoveryActionNodeReboot"},
	RecoveryDrainP2P:      {Degraded, ClearsOnRecovered, ActionDrainP2P, "RecoveryActionDrainP2P"},
	RecoveryDrainAndReset: {Unhealthy, ClearsOnGPUReset, ActionDrainAndResetGPU, "RecoveryActionDrainAndReset"},
	// IMEX domain recovery is not something this GPU or this node can do alone: NVIDIA's IMEX
	// daemons share GPU memory across every node of the NVLink domain, and recovering the
	// domain means restarting them there. Resetting this one GPU does not recover the domain,
	// so a GPU reset does not clear it; NVML reporting none again (the domain recovered) or a
	// reboot (the driver and this node's IMEX daemon start afresh) does. Until then work that
	// shares memory across nodes fails on this GPU, so it is Unhealthy, not Degraded.
	RecoveryRecoverIMEXDomain: {Unhealthy, ClearsOnNodeReboot, ActionRecoverIMEXDomain, "RecoveryActionRecoverIMEXDomain"},
	// A PCIe bus reset resets the GPU: a GPU reset (which the backends detect) or a reboot ends it.
	RecoveryBusReset:     {Unhealthy, ClearsOnGPUReset, ActionResetBus, "RecoveryActionBusReset"},
	RecoverySystemReboot: {Unhealthy, ClearsOnNodeReboot, ActionRebootNode, "RecoveryActionSystemReboot"},
}

// unknownRecoveryReason starts the reason of a recovery action this package does not know; the
// action's numeric value follows, as in "RecoveryActionUnknown9".
const unknownRecoveryReason = "RecoveryActionUnknown"

// recoveryRuleFor returns the rule for a, and false for an action newer than this package. An
// unknown action fails safe: NVML asks for something, and nothing says a GPU reset is enough,
// so the GPU is Unhealthy until NVML reports none again or the node reboots.
func recoveryRuleFor(a RecoveryAction) (recoveryRule, bool) {
	if int(a) < len(recoveryRules) && recoveryRules[a].reason != "" {
		return recoveryRules[a], true
	}
	return recoveryRule{severity: Unhealthy, clearsOn: ClearsOnNodeReboot, action: ActionInspect}, false
}

// hasReason reports whether reason is the one the rule gives action a. It builds nothing on
// the heap, so that repeated signals stay free of allocations.
func (r recoveryRule) hasReason(reason string, a RecoveryAction) bool {
	if r.reason != "" {
		return reason == r.reason
	}
	var buf [32]byte
	b := strconv.AppendUint(append(buf[:0], unknownRecoveryReason...), uint64(a), 10)
	return string(b) == reason
}

// recoveryAction applies NVML's recovery action: none clears the check's condition, anything
// else raises (or changes) it.
func (ev *evaluation) recoveryAction(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RecoveryAction.Enabled {
		return
	}
	if sig.Action == RecoveryNone {
		ev.removeIf(gpu, ReasonRecoveryActionNone, func(c *condState) bool { return c.Type == ConditionRecoveryAction })
		return
	}
	rule, known := recoveryRuleFor(sig.Action)
	if i := gpu.find(ConditionRecoveryAction, 0); i >= 0 && rule.hasReason(gpu.conds[i].Reason, sig.Action) {
		gpu.conds[i].LastSeen = ev.now
		return
	}
	reason, msg := rule.reason, "NVML recommends recovery action "+sig.Action.String()
	if !known {
		reason = unknownRecoveryReason + strconv.Itoa(int(sig.Action))
		msg = fmt.Sprintf("NVML recommends recovery action %d, which this version does not know: "+
			"inspect the GPU (NVML reporting none again, or a node reboot, clears this)", uint8(sig.Action))
	}
	ev.replace(gpu, condState{Condition: Condition{
		Type: ConditionRecoveryAction, Severity: rule.severity, ClearsOn: rule.clearsOn,
		RecommendedAction: rule.action, Reason: reason, Message: msg,
	}})
}
