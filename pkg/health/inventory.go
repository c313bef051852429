package health

import (
	"fmt"
	"strings"
)

// Missing GPUs: capacity a node lost without any XID (a node running 3 of its 4 GPUs: EKS node
// monitoring agent PR #121, AKS GPUMissing, gpud gpu-counts, NVSentinel GpuTotalCountMismatch).
// A GPU that is on the PCI bus but that the backend cannot open, or one a configured expected
// count says should be there, becomes a placeholder device that is Unhealthy with reason
// GPUMissing, and the node carries a finding that it runs below its capacity.

// ConditionGPUMissing is the condition of a placeholder for a missing GPU.
const ConditionGPUMissing ConditionType = "GPUMissing"

// Names of what a missing GPU raises.
const (
	ReasonGPUMissing = "GPUMissing"
	// ReasonBelowCapacity is the node finding's reason.
	ReasonBelowCapacity = "GPUsMissing"
	// MissingUUIDPrefix starts a placeholder's UUID: "MISSING-0000:3b:00.0" for a GPU on the
	// bus, "MISSING-2" for the third of an expected count nobody can place.
	MissingUUIDPrefix = "MISSING-"
)

// MaxGPUs is the most GPUs MissingGPUs lets a node have, its placeholders included: as many as
// the readers of the node's report count (gpuhealthv1.MaxGPUsPerNode) and
// inventory.expectedGPUs can ask for, far more than a server holds. A bus that lists more holds
// fakes (a hostile or broken sysfs), not GPUs: 4,096 fake NVIDIA functions made 4,096
// placeholders, and each costs the Node's gpu-health annotation some 150 bytes; capped, the
// placeholders fit in the 256 KiB the API server allows a Node's annotations.
const MaxGPUs = 1024

// MissingGPUs returns a placeholder for each GPU the node should have and devices lack: each
// address of onBus (PCI addresses in sysfs's form, 0000:3b:00.0) that no device of devices has,
// then, while expected is more than the GPUs known (devices and the placeholders so far), one by
// ordinal. Addresses are compared in sysfs's form (NVML writes 00000000:3B:00.0). Placeholders
// stop once the node has MaxGPUs GPUs: what the bus lists past that is not tracked.
func MissingGPUs(devices []Device, onBus []string, expected int) []Device {
	have := map[string]bool{}
	gpus := 0
	for _, d := range devices {
		if d.MIG != nil {
			continue
		}
		gpus++
		if a, ok := canonicalBusID(d.PCIBusID); ok {
			have[a] = true
		}
	}
	var out []Device
	for _, a := range onBus {
		if gpus+len(out) >= MaxGPUs {
			break
		}
		c, ok := canonicalBusID(a)
		if !ok || have[c] {
			continue
		}
		have[c] = true
		out = append(out, Device{UUID: MissingUUIDPrefix + c, Index: -1, Minor: -1, PCIBusID: c, Missing: true})
	}
	for n := gpus + len(out); n < min(expected, MaxGPUs); n++ {
		out = append(out, Device{UUID: fmt.Sprintf("%s%d", MissingUUIDPrefix, n), Index: -1, Minor: -1, Missing: true})
	}
	return out
}

// canonicalBusID is NormalizePCIBusID as a comma-ok.
func canonicalBusID(id string) (string, bool) {
	s, err := NormalizePCIBusID(id)
	return s, err == nil
}

// markMissingOnce raises GPUMissing on every placeholder and the below-capacity finding the
// first time the tracker is told the time.
func (t *Tracker) markMissingOnce(ev *evaluation) []Transition {
	if t.missingMarked {
		return ev.out
	}
	t.missingMarked = true
	return t.markMissingEv(ev)
}

func (t *Tracker) markMissingEv(ev *evaluation) []Transition {
	var missing []string
	gpus := 0
	for _, ds := range t.ordered {
		if ds.parent != nil {
			continue
		}
		gpus++
		if !ds.dev.Missing {
			continue
		}
		missing = append(missing, ds.dev.UUID)
		where := "on the PCI bus at " + ds.dev.PCIBusID
		if ds.dev.PCIBusID == "" {
			where = "expected by the configuration"
		}
		// Not sticky (recovered): the comparison is made anew at every start, so a GPU that is
		// back is never held missing by a checkpoint.
		ev.raise(ds, raiseSpec{
			Type: ConditionGPUMissing, Severity: Unhealthy, ClearsOn: ClearsOnRecovered,
			RecommendedAction: ActionCheckHardware, Reason: ReasonGPUMissing,
		}, func() string {
			return "a GPU " + where + " that the driver does not answer for (it failed to initialise, fell off the bus before the driver loaded, or is bound to another driver)"
		})
	}
	if len(missing) > 0 && t.findFinding(ReasonBelowCapacity) < 0 {
		t.findings = append(t.findings, NodeFinding{
			Reason:  ReasonBelowCapacity,
			Message: fmt.Sprintf("the node runs %d of its %d GPUs: %s missing", gpus-len(missing), gpus, strings.Join(missing, ", ")),
			Since:   ev.now, LastSeen: ev.now, GPUs: missing,
		})
		t.findingsUnsettled() // a rule could share its name
		t.generation++
	}
	return ev.out
}
