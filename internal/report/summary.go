package report

import (
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// GPUSummary is what every sink says about one device: the facts of the snapshot reduced to what
// a scheduler or an operator reads. Its JSON form is the value of the gpuhealth.dev/gpu-health
// annotation, keyed by UUID.
type GPUSummary struct {
	Index    int    `json:"index"`
	PCIBusID string `json:"pciBusID,omitempty"`
	Model    string `json:"model,omitempty"`
	Health   string `json:"health"`
	// Reasons are the reasons of the conditions in effect, worst first.
	Reasons []string `json:"reasons,omitempty"`
	// Since is when the worst condition in effect began; absent when healthy.
	Since *time.Time `json:"since,omitempty"`
	Evict bool       `json:"evict,omitempty"`
	// ParentUUID is set for MIG instances.
	ParentUUID string `json:"parentUUID,omitempty"`
	// Unmonitored lists what the agent cannot watch on the GPU: "events" when NVML delivers no
	// events for it, and each check the backend cannot run (a driver function missing, ECC off,
	// MIG mode), so an operator sees at once what a node is blind to. No data, never a fault.
	Unmonitored []string `json:"unmonitored,omitempty"`
}

// Unmonitored lists what the agent cannot watch on a device: "events" when NVML delivers no
// events for it, then each check the backend cannot run.
func Unmonitored(d health.DeviceStatus) []string {
	var out []string
	if d.Unmonitored {
		out = append(out, "events")
	}
	for _, c := range d.UnmonitoredChecks {
		out = append(out, string(c))
	}
	return out
}

// Summarize reduces a device's status to a GPUSummary.
func Summarize(d health.DeviceStatus) GPUSummary {
	s := GPUSummary{Index: d.Device.Index, PCIBusID: d.Device.PCIBusID, Model: d.Device.Model, Health: d.Health.String(), Evict: d.Evict}
	s.Unmonitored = Unmonitored(d)
	if d.Device.MIG != nil {
		s.ParentUUID = d.Device.MIG.ParentUUID
	}
	conds := health.WorstFirst(d.Conditions)
	for _, c := range conds {
		if !slices.Contains(s.Reasons, c.Reason) {
			s.Reasons = append(s.Reasons, c.Reason)
		}
	}
	if len(conds) > 0 && d.Health != health.Healthy {
		since := conds[0].Since.UTC()
		s.Since = &since
	}
	return s
}

// UnhealthyIndexes returns the indexes of the physical GPUs that are Unhealthy, ascending. MIG
// instances do not count on their own: an index names a whole card.
func UnhealthyIndexes(snap health.Snapshot) []int {
	var idx []int
	for _, d := range snap.Devices {
		if d.Device.MIG == nil && d.Health == health.Unhealthy {
			idx = append(idx, d.Device.Index)
		}
	}
	slices.Sort(idx)
	return slices.Compact(idx)
}
