package nvml

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The MIG layout can change under a running backend: the GPU operator's MIG manager (mig-parted)
// or an administrator (nvidia-smi mig) turns MIG mode on or off, or makes and destroys GPU and
// compute instances. The backend's inventory, and everything keyed on it downstream (the health
// monitor's devices, the checkpoint, the DRA devices they are matched to), is fixed at Open; so
// the backend compares the layout NVML reports with the one it opened on, when NVML sends a MIG
// configuration-change event and at least every inventory period (WithInventoryCheck), and when
// they differ Run ends with an *InventoryChangedError. The caller opens the backend again, as
// for a driver that went away: the agent re-executes itself and restores its checkpoint, in
// which the conditions of the parent GPUs are kept and those of instances that are gone are
// dropped.

// DefaultInventoryCheck is how often, at least, the MIG layout is compared with the inventory.
const DefaultInventoryCheck = time.Minute

// WithInventoryCheck sets how often, at least, a sampling round compares the MIG layout with the
// inventory (default DefaultInventoryCheck); a MIG configuration-change event also triggers it.
func WithInventoryCheck(d time.Duration) Option { return func(o *options) { o.inventoryCheck = d } }

// ErrInventoryChanged is wrapped by the error Run returns when the MIG layout changed.
var ErrInventoryChanged = errInventoryChanged{}

type errInventoryChanged struct{}

func (errInventoryChanged) Error() string { return "the GPUs' MIG layout changed under NVML" }

// InventoryChangedError says which GPU's MIG layout changed, and how.
type InventoryChangedError struct {
	// GPU is the physical GPU's UUID and Index its index.
	GPU   string
	Index int
	// Before and After are its MIG devices' UUIDs (sorted; nil with MIG off).
	Before, After []string
	// MIGBefore and MIGAfter say whether MIG mode was on.
	MIGBefore, MIGAfter bool
	At                  time.Time
}

// Error implements error.
func (e *InventoryChangedError) Error() string {
	layout := func(on bool, uuids []string) string {
		if !on {
			return "MIG off"
		}
		return fmt.Sprintf("MIG on, %d instances [%s]", len(uuids), strings.Join(uuids, " "))
	}
	return fmt.Sprintf("%s: GPU %d (%s): %s, was %s", ErrInventoryChanged, e.Index, e.GPU, layout(e.MIGAfter, e.After), layout(e.MIGBefore, e.Before))
}

// Unwrap lets errors.Is find ErrInventoryChanged.
func (e *InventoryChangedError) Unwrap() error { return ErrInventoryChanged }

// inventoryDue reports whether this sampling round compares the MIG layout with the inventory.
func (b *Backend) inventoryDue(now time.Time) bool {
	if b.migChanged.Swap(false) {
		return true
	}
	last := time.Unix(0, b.inventoryCheckedAt.Load())
	return now.Sub(last) >= b.opts.inventoryCheck
}

// checkInventory compares each GPU's MIG layout with the inventory. A GPU that cannot be read
// now (lost, a failing call) says nothing: the sampler reports what is wrong with it.
func (b *Backend) checkInventory(now time.Time) *InventoryChangedError {
	b.inventoryCheckedAt.Store(now.UnixNano())
	if !b.sym.hasAll(migSymbols) {
		return nil
	}
	for _, g := range b.gpus {
		if g.handle == nil || g.lost.Load() || !g.migComplete {
			continue
		}
		on, uuids, ok := b.currentMIGs(g)
		if !ok {
			continue
		}
		before := make([]string, 0, len(g.migs))
		for _, m := range g.migs {
			before = append(before, m.UUID)
		}
		slices.Sort(before)
		if on != g.migEnabled || !slices.Equal(uuids, before) {
			return &InventoryChangedError{GPU: g.dev.UUID, Index: g.dev.Index, Before: before, After: uuids,
				MIGBefore: g.migEnabled, MIGAfter: on, At: now}
		}
	}
	return nil
}

// currentMIGs reads g's MIG mode and its MIG devices' UUIDs (sorted); ok is false when NVML
// could not say.
func (b *Backend) currentMIGs(g *gpu) (on bool, uuids []string, ok bool) {
	current, _, ret := g.handle.GetMigMode()
	switch {
	case notSupported(ret):
		return false, nil, true
	case ret != nvml.SUCCESS:
		return false, nil, false
	case current != nvml.DEVICE_MIG_ENABLE:
		return false, nil, true
	}
	n, ret := g.handle.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return false, nil, false
	}
	for j := range n {
		mig, ret := g.handle.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return false, nil, false
		}
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return false, nil, false
		}
		uuids = append(uuids, uuid)
	}
	slices.Sort(uuids)
	return true, uuids, true
}
