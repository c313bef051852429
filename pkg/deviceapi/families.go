package deviceapi

import (
	"slices"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Condition types of a Gpu. Ready is gpuhealth's verdict; each family condition says whether
// that family of checks found a fault. Every Gpu carries all of them, always in this order, so
// that a watcher sees a family go False and True again rather than appear and disappear.
const (
	TypeReady = "Ready"
	// TypeXID: XIDs and the repeat rules over them.
	TypeXID = "XIDHealthy"
	// TypeMemory: uncorrectable and storming ECC errors, row remapping, retired pages, spare
	// rows running out, SRAM errors.
	TypeMemory = "MemoryHealthy"
	// TypeThermal: the temperature against the slowdown and shutdown thresholds.
	TypeThermal = "ThermalHealthy"
	// TypeClocks: clock slowdowns the driver reports: hardware slowdown, power brake, thermal
	// slowdown. gpuhealth reads no power draw, so power faults show here, as a power brake.
	TypeClocks = "ClocksHealthy"
	// TypePCIe: the PCIe replay rate, and a link trained below what it can do.
	TypePCIe = "PCIeHealthy"
	// TypeNVLink: NVLink links down, their error rates and recoveries, the NVLink fabric.
	TypeNVLink = "NVLinkHealthy"
	// TypePresence: a GPU lost from the bus, or one the node should have and the driver does
	// not answer for.
	TypePresence = "PresenceHealthy"
	// TypeRecoveryAction: the driver asks for a GPU reset or a reboot.
	TypeRecoveryAction = "RecoveryActionHealthy"
	// TypeRepair: faults came back after repairs; the GPU wants replacing.
	TypeRepair = "RepairHealthy"
	// TypeOther: a condition type this table does not know (a newer library's, an embedder's).
	TypeOther = "OtherHealthy"
)

// familyTypes are the family condition types by health.Family (from FamilyXID on), in the order a
// Gpu carries them (after Ready).
var familyTypes = []string{TypeXID, TypeMemory, TypeThermal, TypeClocks, TypePCIe, TypeNVLink, TypePresence, TypeRecoveryAction, TypeRepair, TypeOther}

// FamilyTypes lists the family condition types, in the order a Gpu carries them (after Ready).
func FamilyTypes() []string { return slices.Clone(familyTypes) }

// Family returns the family condition type of conditions of type t; ok is false for types that
// belong to no family (ConditionAdmin, an operator's drain: it is no fault of the GPU, and shows
// in Ready alone).
func Family(t health.ConditionType) (family string, ok bool) {
	f := t.Family()
	if f == health.FamilyNone {
		return "", false
	}
	return familyTypes[f-health.FamilyXID], true
}

// checksOf lists the checks behind each family that a backend can report it cannot run
// (health.Check). A family none of whose checks runs on a GPU is Unknown there: no data, never
// a fault. XIDs come with the GPU's events, which DeviceStatus.Unmonitored covers.
var checksOf = map[string][]health.Check{
	TypeMemory:         {health.CheckECC, health.CheckRowRemap, health.CheckRetiredPages, health.CheckRowRemapHistogram, health.CheckSRAM},
	TypeThermal:        {health.CheckThermal},
	TypeClocks:         {health.CheckClockEvents},
	TypePCIe:           {health.CheckPCIeReplays, health.CheckPCIeLink},
	TypeNVLink:         {health.CheckNVLink, health.CheckFabric, health.CheckNVLinkRecoveries},
	TypeRecoveryAction: {health.CheckRecoveryAction},
}
