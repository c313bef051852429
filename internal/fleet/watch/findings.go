package watch

import (
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
)

// The ConfigMap the Watcher publishes its verdict in, in the controller's namespace.
const (
	ConfigMapName = "gpuhealth-fleet-findings"
	// FindingsKey holds Findings as JSON.
	FindingsKey = "findings"
)

// Bounds of the published verdict: a ConfigMap holds at most 1 MiB, and every reader reads it
// whole.
const (
	// MaxSharedCauses is the most findings published (strongest first); the rest are counted in
	// SharedCausesLeftOut and raise no Event or metric series.
	MaxSharedCauses = 100
	// MaxSignatures is the most workload signatures published (by workload), the rest counted
	// in SignaturesLeftOut; MaxSignatureGPUs the most GPUs one names (SpannedGPUs counts them all).
	MaxSignatures    = 100
	MaxSignatureGPUs = 32
	// MaxFindingsBytes bounds the JSON whatever the lengths of the names in it (labels, workloads,
	// reasons): past it, signatures and then findings are left out, half at a time.
	MaxFindingsBytes = 512 << 10
	// RefreshEvery is how often an unchanged verdict is written again, with its new judgedAt.
	RefreshEvery = 10 * time.Minute
)

// Findings is the verdict the ConfigMap holds: one judgement of the fleet.
type Findings struct {
	// JudgedAt is when the controller judged it (its clock). An unchanged verdict is written
	// again every RefreshEvery: one older than that and a period is a stopped controller's.
	JudgedAt time.Time `json:"judgedAt"`
	// Window says which faults counted: those of [JudgedAt-Window, JudgedAt].
	Window metav1.Duration `json:"window"`
	// WorkloadsUnknown says the pods could not be read: a job's signature counts as its GPUs'
	// faults.
	WorkloadsUnknown bool `json:"workloadsUnknown,omitempty"`
	// NodesUnreadable counts the nodes whose gpu-health annotation could not be read: their GPUs
	// are left out.
	NodesUnreadable int `json:"nodesUnreadable,omitempty"`
	// GPUs, FaultyGPUs, Faults, FleetRate, GroupsTested and Threshold are the judgement's
	// (sharedcause.Result).
	GPUs         int     `json:"gpus"`
	FaultyGPUs   int     `json:"faultyGPUs"`
	Faults       int     `json:"faults"`
	FleetRate    float64 `json:"fleetRate"`
	GroupsTested int     `json:"groupsTested"`
	Threshold    float64 `json:"threshold"`
	// SharedCauses are the findings, strongest first, at most MaxSharedCauses.
	SharedCauses        []sharedcause.Finding `json:"sharedCauses"`
	SharedCausesLeftOut int                   `json:"sharedCausesLeftOut,omitempty"`
	// Signatures are the workloads' signatures, by workload, at most MaxSignatures.
	Signatures        []Signature `json:"signatures"`
	SignaturesLeftOut int         `json:"signaturesLeftOut,omitempty"`
}

// Signature is a workload's signature as published: its GPUs capped at MaxSignatureGPUs.
type Signature struct {
	sharedcause.Signature
	// SpannedGPUs is how many GPUs it spans, GPUs naming the first MaxSignatureGPUs of them.
	SpannedGPUs int `json:"spannedGPUs"`
}

// newFindings is the verdict of res as published: the lists capped.
func newFindings(res sharedcause.Result, unreadable int, workloadsUnknown bool) Findings {
	f := Findings{
		JudgedAt: res.Now, Window: metav1.Duration{Duration: res.Window}, WorkloadsUnknown: workloadsUnknown, NodesUnreadable: unreadable,
		GPUs: res.GPUs, FaultyGPUs: res.FaultyGPUs, Faults: res.Faults, FleetRate: res.FleetRate,
		GroupsTested: res.GroupsTested, Threshold: res.Threshold,
		SharedCauses: res.SharedCauses[:min(len(res.SharedCauses), MaxSharedCauses)],
		Signatures:   make([]Signature, 0, min(len(res.Signatures), MaxSignatures)),
	}
	f.SharedCausesLeftOut = len(res.SharedCauses) - len(f.SharedCauses)
	if f.SharedCauses == nil {
		f.SharedCauses = []sharedcause.Finding{}
	}
	for _, s := range res.Signatures[:min(len(res.Signatures), MaxSignatures)] {
		n := len(s.GPUs)
		s.GPUs = s.GPUs[:min(n, MaxSignatureGPUs)]
		f.Signatures = append(f.Signatures, Signature{Signature: s, SpannedGPUs: n})
	}
	f.SignaturesLeftOut = len(res.Signatures) - len(f.Signatures)
	return f
}

// encode returns the verdict as JSON, leaving signatures and then findings out until it fits in
// MaxFindingsBytes.
func (f *Findings) encode() ([]byte, error) {
	for {
		data, err := json.Marshal(f)
		if err != nil || len(data) <= MaxFindingsBytes {
			return data, err
		}
		switch {
		case len(f.Signatures) > 0:
			keep := len(f.Signatures) / 2
			f.SignaturesLeftOut += len(f.Signatures) - keep
			f.Signatures = f.Signatures[:keep]
		case len(f.SharedCauses) > 0:
			keep := len(f.SharedCauses) / 2
			f.SharedCausesLeftOut += len(f.SharedCauses) - keep
			f.SharedCauses = f.SharedCauses[:keep]
		default:
			return nil, fmt.Errorf("the verdict takes %d bytes with no finding", len(data))
		}
	}
}

// sameVerdict reports whether a and b say the same, whenever judged.
func sameVerdict(a, b Findings) bool {
	a.JudgedAt, b.JudgedAt = time.Time{}, time.Time{}
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

// ParseFindings reads the verdict from the Watcher's ConfigMap.
func ParseFindings(cm *corev1.ConfigMap) (Findings, error) {
	var f Findings
	v, ok := cm.Data[FindingsKey]
	if !ok {
		return f, fmt.Errorf("ConfigMap %s/%s has no %s", cm.Namespace, cm.Name, FindingsKey)
	}
	if err := json.Unmarshal([]byte(v), &f); err != nil {
		return f, fmt.Errorf("ConfigMap %s/%s, %s: %w", cm.Namespace, cm.Name, FindingsKey, err)
	}
	return f, nil
}
