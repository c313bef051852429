package health

// Family groups the condition types by what failed: the Device API's family conditions and
// NVSentinel's checkNames are one per family, so that a consumer sees a few stable groups
// rather than one entry per condition type.
type Family uint8

// Families, in the order their consumers list them.
const (
	// FamilyNone: ConditionAdmin, an operator's drain. It is no fault of the GPU.
	FamilyNone Family = iota
	// FamilyXID: XIDs and the repeat rules over them.
	FamilyXID
	// FamilyMemory: uncorrectable and storming ECC errors, row remapping, retired pages, spare
	// rows running out, SRAM errors.
	FamilyMemory
	// FamilyThermal: the temperature against the slowdown and shutdown thresholds.
	FamilyThermal
	// FamilyClocks: clock slowdowns the driver reports.
	FamilyClocks
	// FamilyPCIe: the PCIe replay rate, and a link trained below what it can do.
	FamilyPCIe
	// FamilyNVLink: NVLink links down, their error rates and recoveries, the NVLink fabric.
	FamilyNVLink
	// FamilyPresence: a GPU lost from the bus, or one the node should have and the driver does
	// not answer for.
	FamilyPresence
	// FamilyRecoveryAction: the driver asks for a GPU reset or a reboot.
	FamilyRecoveryAction
	// FamilyRepair: faults came back after repairs, here or (a repeat offender) on other nodes;
	// the GPU wants replacing or inspecting.
	FamilyRepair
	// FamilyOther: a condition type this table does not know (a newer library's, an embedder's).
	FamilyOther
)

// families maps the library's condition types to their family.
var families = map[ConditionType]Family{
	ConditionAdmin:                FamilyNone,
	ConditionXID:                  FamilyXID,
	ConditionXIDRepeat:            FamilyXID,
	ConditionECCUncorrected:       FamilyMemory,
	ConditionECCCorrectedStorm:    FamilyMemory,
	ConditionRowRemapFailure:      FamilyMemory,
	ConditionRowRemapPending:      FamilyMemory,
	ConditionRetiredPagesPending:  FamilyMemory,
	ConditionRowRemapAvailability: FamilyMemory,
	ConditionSRAMThreshold:        FamilyMemory,
	ConditionThermal:              FamilyThermal,
	ConditionClockThrottle:        FamilyClocks,
	ConditionPCIeReplayRate:       FamilyPCIe,
	ConditionPCIeLinkDegraded:     FamilyPCIe,
	ConditionNVLinkDown:           FamilyNVLink,
	ConditionNVLinkErrorRate:      FamilyNVLink,
	ConditionNVLinkRecoveries:     FamilyNVLink,
	ConditionFabricRegistration:   FamilyNVLink,
	ConditionFabricHealth:         FamilyNVLink,
	ConditionGPULost:              FamilyPresence,
	ConditionGPUMissing:           FamilyPresence,
	ConditionGPUResetRequired:     FamilyRecoveryAction,
	ConditionRecoveryAction:       FamilyRecoveryAction,
	ConditionReplaceGPU:           FamilyRepair,
	ConditionRepeatOffender:       FamilyRepair,
}

// Family returns the family of conditions of type t: FamilyOther for a type the library does
// not know.
func (t ConditionType) Family() Family {
	if f, ok := families[t]; ok {
		return f
	}
	return FamilyOther
}
