package v1

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Version names this wire format.
const Version = "v1"

// Annotation keys.
const (
	// UnhealthyIDsKey is Volcano's list of Unhealthy GPU indexes.
	UnhealthyIDsKey = "volcano.sh/gpu-unhealthy-ids"
	// HealthKey holds the per-device summaries (GPUSummary by UUID).
	HealthKey = "gpuhealth.dev/gpu-health"
	// DrainsKey holds administrative per-GPU drains (Drain by UUID), written by `gpuhealth drain`
	// and read by the agent and the extender.
	DrainsKey = "gpuhealth.dev/gpu-drains"
	// VolcanoStateKey records gpuhealth's share of UnhealthyIDsKey, because that key has other
	// writers (Volcano's device plugin, operators). Its value is JSON, {"written":"3,5","others":"5"}:
	// the value gpuhealth last wrote and the part of it that belonged to other writers
	// (docs/compatibility.md has the merge rules).
	VolcanoStateKey = "gpuhealth.dev/volcano-unhealthy-ids-state"
	// HAMiCordonKey is HAMi's per-GPU cordon: device UUIDs, comma-separated.
	HAMiCordonKey = "hami.io/device-cordon"
	// HAMiStateKey records gpuhealth's share of HAMiCordonKey, in VolcanoStateKey's format.
	HAMiStateKey = "gpuhealth.dev/hami-device-cordon-state"
)

// GPUSummary is what gpuhealth says about one device: the facts of the snapshot reduced to what a
// scheduler or an operator reads. HealthKey's value is a JSON object of them keyed by UUID.
type GPUSummary struct {
	Index    int    `json:"index"`
	PCIBusID string `json:"pciBusID,omitempty"`
	Model    string `json:"model,omitempty"`
	// Serial is a physical GPU's board serial number (health.Device.Serial, NVML's
	// nvmlDeviceGetSerial): what names the board wherever it is plugged in, where the UUID and
	// the PCI address name it on one node. Absent when the GPU or its driver has none, on MIG
	// instances and on placeholders (Missing). A claim of the node's agent, as the rest is:
	// readers check it before they key anything on it.
	Serial string `json:"serial,omitempty"`
	// VBIOS is a physical GPU's VBIOS version (health.Device.VBIOS, NVML's
	// nvmlDeviceGetVbiosVersion, such as "96.00.89.00.01"): boards flashed alike share it, so the
	// fleet's judge groups faults by it. Absent when unknown, on MIG instances and on placeholders.
	VBIOS string `json:"vbios,omitempty"`
	// Health is Healthy, Degraded or Unhealthy.
	Health string `json:"health"`
	// Reasons are the reasons of the conditions in effect, worst first.
	Reasons []string `json:"reasons,omitempty"`
	// Since is when the worst condition in effect began; absent when healthy.
	Since *time.Time `json:"since,omitempty"`
	// Evict is set when the fault corrupts running work: pods should leave the GPU.
	Evict bool `json:"evict,omitempty"`
	// ParentUUID is set for MIG instances.
	ParentUUID string `json:"parentUUID,omitempty"`
	// Unmonitored lists what the agent cannot watch on the GPU: "events" when NVML delivers no
	// events for it, and each check the backend cannot run (a driver function missing, ECC off,
	// MIG mode), so an operator sees at once what a node is blind to. No data, never a fault.
	Unmonitored []string `json:"unmonitored,omitempty"`
	// History sums up a physical GPU's faults and repairs across restarts and reboots; absent
	// when it has none.
	History *HistorySummary `json:"history,omitempty"`
	// Missing marks a GPU the node should have and the driver does not answer for (a
	// placeholder: index -1, UUID MISSING-<PCI address>). It is in no scheduler's pool.
	Missing bool `json:"missing,omitempty"`
	// XIDFaults are the physical GPU's Unhealthy XID conditions of its own (none the driver
	// said another XID caused), with when each began: the faults the agents of the other nodes
	// of its NVLink domain attribute their GPUs' caused-by XIDs to (PeerFaults).
	XIDFaults []XIDFault `json:"xidFaults,omitempty"`
	// Validation is how the GPU's last return to service after a repair was judged: an active
	// test passed or failed, or "passive" (no test was configured: it came back after a quiet
	// probation). Absent when it was never repaired.
	Validation *ValidationSummary `json:"validation,omitempty"`
}

// ValidationSummary is the newest validation verdict of a GPU's history.
type ValidationSummary struct {
	At time.Time `json:"at"`
	// Result is passed, failed or passive (health.ValidationResult).
	Result string `json:"result"`
	// By is what judged it: the format and program of the test ("dcgm: dcgmi"), or
	// "probation".
	By string `json:"by,omitempty"`
}

// XIDFault is one XID fault of a GPU's own, as GPUSummary.XIDFaults carries it.
type XIDFault struct {
	XID   uint32    `json:"xid"`
	Since time.Time `json:"since"`
}

// HistorySummary is a GPU's history as the annotation carries it: counts, and the newest entries,
// so that an operator sees a card that keeps failing without reading the node's disk, and an
// agent whose checkpoint is lost rebuilds what escalation needs from its own report.
type HistorySummary struct {
	// Faults, Resets and Reboots count all the entries the tracker keeps (health.MaxHistory).
	Faults  int `json:"faults"`
	Resets  int `json:"resets"`
	Reboots int `json:"reboots"`
	// Recent are the newest MaxRecentHistory entries, oldest first.
	Recent []health.HistoryEntry `json:"recent,omitempty"`
}

// MaxRecentHistory bounds HistorySummary.Recent. The annotation is in every write of the Node,
// and every scheduler's informer receives every update of it: with all health.MaxHistory
// entries, 32 on each of 8 GPUs that failed and were reset over and over (about 18 KiB), the
// agent's annotation write took twice as long (signal → volcano.sh/gpu-unhealthy-ids p50 12.5 ms
// against 6.8 ms without entries, docs/benchmarks.md's latency run), and with 8 entries 7.7 ms.
// Four entries are two faults and their repairs: what the default escalation (a fault back
// after a repair twice) needs when an agent rebuilds it from its report, and what an operator
// reads first; the counts and the checkpoint keep the rest.
const MaxRecentHistory = 4

// SummarizeHistory reduces a GPU's history; nil when it has none.
func SummarizeHistory(h []health.HistoryEntry) *HistorySummary {
	if len(h) == 0 {
		return nil
	}
	// Validation verdicts are GPUSummary.Validation, not faults or repairs.
	isValidation := func(e health.HistoryEntry) bool { return e.Kind == health.HistoryValidation }
	if slices.ContainsFunc(h, isValidation) {
		if h = slices.DeleteFunc(slices.Clone(h), isValidation); len(h) == 0 {
			return nil
		}
	}
	s := &HistorySummary{}
	for _, e := range h {
		switch e.Kind {
		case health.HistoryFault:
			s.Faults++
		case health.HistoryReset:
			s.Resets++
		case health.HistoryReboot:
			s.Reboots++
		}
	}
	recent := h[max(0, len(h)-MaxRecentHistory):]
	s.Recent = make([]health.HistoryEntry, len(recent))
	for i, e := range recent {
		e.Time = e.Time.UTC()
		s.Recent[i] = e
	}
	return s
}

// String says it in a few words: "2 faults, 1 reset, 1 reboot".
func (s *HistorySummary) String() string {
	if s == nil {
		return "<none>"
	}
	plural := func(n int, what string) string {
		if n == 1 {
			return "1 " + what
		}
		return fmt.Sprintf("%d %ss", n, what)
	}
	return plural(s.Faults, "fault") + ", " + plural(s.Resets, "reset") + ", " + plural(s.Reboots, "reboot")
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
	s.History = SummarizeHistory(d.History)
	if v, ok := health.LastValidation(d.History); ok {
		s.Validation = &ValidationSummary{At: v.Time.UTC(), Result: v.Reason, By: v.By}
	}
	s.Missing = d.Device.Missing
	if d.Device.MIG != nil {
		s.ParentUUID = d.Device.MIG.ParentUUID
	} else if !d.Device.Missing {
		s.Serial, s.VBIOS = d.Device.Serial, d.Device.VBIOS
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
	if d.Device.MIG == nil {
		for _, c := range d.Conditions {
			if c.Type == health.ConditionXID && c.Severity >= health.Unhealthy && !c.CausedByPrevious {
				s.XIDFaults = append(s.XIDFaults, XIDFault{XID: c.Code, Since: c.Since.UTC()})
			}
		}
		slices.SortFunc(s.XIDFaults, func(a, b XIDFault) int { return cmp.Compare(a.XID, b.XID) })
	}
	return s
}

// Summaries returns HealthKey's value for a snapshot: every device's summary by UUID.
func Summaries(snap health.Snapshot) map[string]GPUSummary {
	out := make(map[string]GPUSummary, len(snap.Devices))
	for _, d := range snap.Devices {
		out[d.Device.UUID] = Summarize(d)
	}
	return out
}

// ParseHealth decodes HealthKey's value. An empty value means no devices.
func ParseHealth(value string) (map[string]GPUSummary, error) {
	return parseByUUID[GPUSummary](HealthKey, value)
}

// ParseHealthEach decodes HealthKey's value entry by entry: an entry that does not decode is
// left out and named in bad ("GPU-x": why), and the others are kept, so that a reader rebuilding
// state from a partly corrupt report keeps what it can. err is set only when the value is no
// JSON object at all.
func ParseHealthEach(value string) (summaries map[string]GPUSummary, bad []string, err error) {
	summaries, err = ParseHealth(value)
	if err == nil {
		return summaries, nil, nil
	}
	var entries map[string]json.RawMessage
	if json.Unmarshal([]byte(value), &entries) != nil {
		return nil, nil, err
	}
	summaries = make(map[string]GPUSummary, len(entries))
	for uuid, raw := range entries {
		one, merr := json.Marshal(map[string]json.RawMessage{uuid: raw})
		if merr != nil {
			bad = append(bad, fmt.Sprintf("%q: %v", uuid, merr))
			continue
		}
		s, perr := ParseHealth(string(one))
		if perr != nil {
			bad = append(bad, fmt.Sprintf("%q: %v", uuid, perr))
			continue
		}
		summaries[uuid] = s[uuid]
	}
	slices.Sort(bad)
	return summaries, bad, nil
}

// UnhealthyIndexes returns the indexes of the physical GPUs that are Unhealthy, ascending. MIG
// instances do not count on their own: an index names a whole card.
func UnhealthyIndexes(snap health.Snapshot) []int {
	var idx []int
	for _, d := range snap.Devices {
		// A missing GPU has no index: the device plugin never offered it.
		if d.Device.MIG == nil && !d.Device.Missing && d.Health == health.Unhealthy {
			idx = append(idx, d.Device.Index)
		}
	}
	slices.Sort(idx)
	return slices.Compact(idx)
}

// AgentAnnotations returns what the agent writes for the GPUs of snap on a Node whose annotations
// are current, by key ("" means the annotation must be absent): the Volcano list with ours merged
// into other writers' entries (MergeUnhealthyIDs), its state, and the gpu-health summaries
// (HealthKey); and the merge, whose Invalid, StateErr and Oversized tell of other writers' bad
// input. A conditional write computes it again from the Node as it is at each attempt.
func AgentAnnotations(snap health.Snapshot, current map[string]string) (map[string]string, MergeResult, error) {
	summaries, err := json.Marshal(Summaries(snap)) // map keys are sorted: the value is deterministic
	if err != nil {
		return nil, MergeResult{}, err
	}
	merged := MergeUnhealthyIDs(current, UnhealthyIndexes(snap))
	return map[string]string{UnhealthyIDsKey: merged.Value, HealthKey: string(summaries), VolcanoStateKey: merged.State}, merged, nil
}

// Drain records who drained a GPU, when and why. A drained GPU is treated by every reporter as
// Unhealthy with reason AdminDrain, until `gpuhealth undrain`.
type Drain struct {
	Index  int       `json:"index"`
	Reason string    `json:"reason"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
}

// ParseDrains decodes DrainsKey's value. An empty value means no drains.
func ParseDrains(value string) (map[string]Drain, error) {
	return parseRequests[Drain](DrainsKey, value)
}

// FormatDrains encodes drains as DrainsKey's value; "" when there are none (remove the
// annotation).
func FormatDrains(drains map[string]Drain) (string, error) {
	return formatByUUID(drains)
}

// Message is how a drain reads in a condition message.
func (d Drain) Message() string {
	msg := "drained by " + d.By
	if !d.At.IsZero() {
		msg += " at " + d.At.UTC().Format(time.RFC3339)
	}
	if d.Reason != "" {
		msg += ": " + d.Reason
	}
	return msg
}
