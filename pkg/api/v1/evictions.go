package v1

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// EvictionsKey is the Node annotation where the agent publishes the evictions it holds back: in
// dry-run mode the pods it would evict, and otherwise the pods a PodDisruptionBudget blocks, the
// report-only ones and the GPUs the circuit breaker holds. A JSON object of GPUEvictions keyed by
// GPU UUID; absent when none. It is kept small (MaxEvictionPods per GPU): the Events on the pods
// carry the rest.
const EvictionsKey = "gpuhealth.dev/gpu-evictions"

// MaxEvictionPods bounds the pods listed for one GPU in EvictionsKey.
const MaxEvictionPods = 16

// Pending eviction states.
const (
	// EvictionDryRun: the pod would be evicted; dry-run mode evicts nothing.
	EvictionDryRun = "DryRun"
	// EvictionReportOnly: the pod's namespace is report-only.
	EvictionReportOnly = "ReportOnly"
	// EvictionBlocked: the Eviction API refused (a PodDisruptionBudget); retried with backoff.
	EvictionBlocked = "Blocked"
	// EvictionHeld: the circuit breaker holds the GPU's evictions back.
	EvictionHeld = "Held"
	// EvictionWaiting: the grace period has not run out yet.
	EvictionWaiting = "Waiting"
)

// GPUEvictions are the pods of one GPU whose eviction is pending or only reported.
type GPUEvictions struct {
	Index int           `json:"index"`
	Pods  []PodEviction `json:"pods"`
	// More counts the pods left out past MaxEvictionPods.
	More int `json:"more,omitempty"`
}

// PodEviction is one pod's pending eviction.
type PodEviction struct {
	// Pod is namespace/name.
	Pod string `json:"pod"`
	// Via is how the pod holds the GPU: device-plugin or volcano.
	Via   string    `json:"via"`
	State string    `json:"state"`
	Since time.Time `json:"since,omitzero"`
}

// ParseEvictions decodes EvictionsKey's value; an empty value means nothing pending.
func ParseEvictions(value string) (map[string]GPUEvictions, error) {
	return parseByUUID[GPUEvictions](EvictionsKey, value)
}

// FormatEvictions encodes the pending evictions as EvictionsKey's value, "" for none. Pods past
// MaxEvictionPods are counted in More.
func FormatEvictions(gpus map[string]GPUEvictions) (string, error) {
	if len(gpus) == 0 {
		return "", nil
	}
	out := make(map[string]GPUEvictions, len(gpus))
	for uuid, g := range gpus {
		if n := len(g.Pods); n > MaxEvictionPods {
			g.More += n - MaxEvictionPods
			g.Pods = g.Pods[:MaxEvictionPods]
		}
		out[uuid] = g
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("%s: %w", EvictionsKey, err)
	}
	return string(b), nil
}

// Short is the pending evictions as a table cell: "DryRun: ns/a, ns/b (+3)".
func (g GPUEvictions) Short() string {
	if len(g.Pods) == 0 {
		return "-"
	}
	var parts []string
	last := ""
	for _, p := range g.Pods {
		if p.State != last {
			parts = append(parts, p.State+": "+p.Pod)
			last = p.State
			continue
		}
		parts[len(parts)-1] += "," + p.Pod
	}
	s := strings.Join(parts, " ")
	if g.More > 0 {
		s += fmt.Sprintf(" (+%d)", g.More)
	}
	return s
}
