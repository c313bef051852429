package health

import (
	"fmt"
	"slices"
)

// Check names one family of checks, as the configuration file does (checks.<name>).
type Check string

// The checks a backend can report as not running on a device.
const (
	CheckECC               Check = "ecc"
	CheckRowRemap          Check = "rowRemap"
	CheckRetiredPages      Check = "retiredPages"
	CheckThermal           Check = "thermal"
	CheckClockEvents       Check = "clockEvents"
	CheckPCIeReplays       Check = "pcieReplays"
	CheckNVLink            Check = "nvlink"
	CheckRecoveryAction    Check = "recoveryAction"
	CheckFabric            Check = "fabric"
	CheckRowRemapHistogram Check = "rowRemapHistogram"
	CheckSRAM              Check = "sram"
	CheckPCIeLink          Check = "pcieLink"
	CheckNVLinkRecoveries  Check = "nvlinkRecoveries"
)

// SetCheckUnmonitored records that the backend cannot run one check on a device (ECC is
// disabled, the driver lacks the function the check needs), or clears the mark. Like
// SetUnmonitored, it is visible in snapshots (DeviceStatus.UnmonitoredChecks) and never changes
// health: a check that cannot run is no data, not a fault.
func (t *Tracker) SetCheckUnmonitored(uuid string, check Check, unmonitored bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[uuid]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownDevice, uuid)
	}
	i, marked := slices.BinarySearch(ds.uncheckable, check)
	switch {
	case unmonitored && !marked:
		ds.uncheckable = slices.Insert(ds.uncheckable, i, check)
	case !unmonitored && marked:
		ds.uncheckable = slices.Delete(ds.uncheckable, i, i+1)
	default:
		return nil
	}
	t.generation++
	return nil
}
