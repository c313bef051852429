package nvsentinel

import (
	"slices"
	"strconv"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// The checkName of each family of gpuhealth's conditions. NVSentinel makes each checkName a Node
// condition type, so there are a few stable ones, not one per XID; the errorCode tells the faults
// of one family apart (ErrorCode).
const (
	// CheckXID: XIDs (the XID number as errorCode) and the repeat rules (the rule's name).
	CheckXID = "GpuHealthXID"
	// CheckMemory: uncorrectable and storming ECC errors, row remapping, page retirement, SRAM.
	CheckMemory = "GpuHealthMemory"
	// CheckThermal: the temperature against the slowdown and shutdown thresholds.
	CheckThermal = "GpuHealthThermal"
	// CheckClocks: clock slowdowns the driver reports (hardware slowdown, power brake, thermal
	// slowdown). gpuhealth reads no power draw, so there is no power family of its own.
	CheckClocks = "GpuHealthClocks"
	// CheckPCIe: PCIe replay rate and a link trained below its width or generation.
	CheckPCIe = "GpuHealthPCIe"
	// CheckNVLink: NVLink links down, error rates, recoveries, and the NVLink fabric.
	CheckNVLink = "GpuHealthNVLink"
	// CheckMissing: a GPU lost from the bus, or missing from the node's inventory.
	CheckMissing = "GpuHealthMissing"
	// CheckRecoveryAction: the driver asks for a reset or a reboot (NVML's GPU recovery action,
	// ERROR_RESET_REQUIRED).
	CheckRecoveryAction = "GpuHealthRecoveryAction"
	// CheckRepair: gpuhealth's own repair of the GPU: a GPU to replace (faults came back after
	// repairs), and the agent's remediation (Options.Checks).
	CheckRepair = "GpuHealthRepair"
	// CheckOther: a condition type this table does not know (a newer library's).
	CheckOther = "GpuHealthOther"
)

// checks are the checkNames by health.Family (from FamilyXID on), in the order events of a batch
// name them.
var checks = []string{CheckXID, CheckMemory, CheckThermal, CheckClocks, CheckPCIe, CheckNVLink, CheckMissing, CheckRecoveryAction, CheckRepair, CheckOther}

// Checks lists every checkName gpuhealth sends, in the order events of a batch name them.
func Checks() []string { return slices.Clone(checks) }

// CheckName returns the checkName of conditions of type t; extra are the embedder's own types
// (Options.Checks), which take precedence. ok is false for types that are never sent:
// ConditionAdmin (an operator's drain) is left out on purpose, as it is no fault of the GPU, and
// NVSentinel would quarantine the whole node for it.
func CheckName(t health.ConditionType, extra map[health.ConditionType]string) (name string, ok bool) {
	if name, ok := extra[t]; ok {
		return name, true
	}
	f := t.Family()
	if f == health.FamilyNone {
		return "", false
	}
	return checks[f-health.FamilyXID], true
}

// perLink are the condition types whose Code is an NVLink link.
var perLink = []health.ConditionType{health.ConditionNVLinkDown, health.ConditionNVLinkErrorRate, health.ConditionNVLinkRecoveries}

// ErrorCode returns the errorCode of c: the XID as a decimal number ("79"), as NVSentinel's own
// monitors send it; a repeat rule's name ("RepeatedXID13OnSameGPU"); the condition type and the
// link for per-link NVLink conditions ("NVLinkDown-link2"); the condition type otherwise
// ("ECCUncorrected"). Every fault of one GPU and check has a code of its own, which scopes the
// healthy event that ends it.
func ErrorCode(c health.Condition) string {
	switch {
	case c.Type == health.ConditionXID:
		return strconv.FormatUint(uint64(c.Code), 10)
	case c.Type == health.ConditionXIDRepeat:
		return c.Reason
	case slices.Contains(perLink, c.Type):
		return string(c.Type) + "-link" + strconv.FormatUint(uint64(c.Code), 10)
	case c.Code != 0:
		return string(c.Type) + "-" + strconv.FormatUint(uint64(c.Code), 10)
	default:
		return string(c.Type)
	}
}

// Action returns the recommendedAction for an Unhealthy condition recommending a: a reset-class
// action asks for COMPONENT_RESET when the GPU has a real UUID (NVSentinel resets GPUs by
// GPU_UUID; a made-up one falls back to reboot), a reboot-class one for reboot (RESTART_BM or
// RESTART_VM), one that needs a person (check the hardware or the cooling, replace, inspect) for
// CONTACT_SUPPORT, and one that needs nothing of NVSentinel for NONE. An action this table does
// not know asks for CONTACT_SUPPORT, as NVSentinel's own XID catalog does.
func Action(a health.Action, realUUID bool, reboot datamodels.RecommendedAction) datamodels.RecommendedAction {
	switch a {
	case health.ActionNone, health.ActionRestartApplication, health.ActionDrainP2P:
		return datamodels.RecommendedAction_NONE
	case health.ActionResetGPU, health.ActionDrainAndResetGPU, health.ActionResetBus:
		if !realUUID {
			return reboot
		}
		return datamodels.RecommendedAction_COMPONENT_RESET
	case health.ActionRebootNode, health.ActionRecoverIMEXDomain:
		// NVSentinel has no IMEX action; the domain's daemon comes back with the node.
		return reboot
	default: // checkHardware, checkCooling, inspect, replaceSoon, replaceGPU, and any newer one
		return datamodels.RecommendedAction_CONTACT_SUPPORT
	}
}
