package watch

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
)

// Event reasons of the Watcher, on its ConfigMap.
const (
	EventSharedCause       = "FleetSharedCause"
	EventSharedCauseGone   = "FleetSharedCauseGone"
	EventWorkloadSignature = "FleetWorkloadSignature"
)

// EventRecorder is the part of client-go's record.EventRecorder the Watcher uses.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// reporter tells what changed from one published verdict to the next: Events, and the metrics
// through the Options' callbacks.
type reporter struct {
	opts *Options
	// findings are the current findings, by attribute=value; signatures the current signatures.
	findings   map[string]sharedcause.Finding
	signatures []Signature
}

// report posts the Events of the findings and signatures that appeared or ended since the last
// verdict, on cm, and updates the metrics.
func (r *reporter) report(ctx context.Context, cm *corev1.ConfigMap, f Findings) {
	logger := klog.FromContext(ctx)
	window := f.Window.Duration
	current := make(map[string]sharedcause.Finding, len(f.SharedCauses))
	for _, c := range f.SharedCauses {
		key := c.Attribute + "=" + c.Value
		current[key] = c
		if _, was := r.findings[key]; was {
			continue
		}
		logger.Info("A shared cause of GPU faults", "shared", key, "faultyGPUs", c.FaultyGPUs, "gpus", c.GPUs, "ratio", c.Ratio, "pValue", c.PValue)
		r.finding(c, true)
		r.event(cm, corev1.EventTypeWarning, EventSharedCause,
			"GPUs sharing %s fail far more often than the rest: %d of its %d GPUs had a fault in the last %v, on %d of its %d nodes; %.2f%% against %.2f%% for the rest (%.1f×, p=%.2g); reasons: %s",
			key, c.FaultyGPUs, c.GPUs, window, c.FaultyNodes, c.Nodes, 100*c.Rate, 100*c.RestRate, c.Ratio, c.PValue, reasons(c.Reasons))
	}
	for key, c := range r.findings {
		if _, still := current[key]; still {
			continue
		}
		logger.Info("A shared cause of GPU faults ended", "shared", key)
		r.finding(c, false)
		r.event(cm, corev1.EventTypeNormal, EventSharedCauseGone, "%s is no longer a shared cause of the GPU faults of the last %v", key, window)
	}
	r.findings = current
	for _, s := range f.Signatures {
		if r.known(s) {
			continue
		}
		logger.Info("A workload's signature", "workload", s.Workload, "reason", s.Reason, "gpus", s.SpannedGPUs)
		r.event(cm, corev1.EventTypeWarning, EventWorkloadSignature,
			"workload %s: %s on %d of its %d GPUs within %v (%d faults), first at %s: the workload's signature, not counted as its GPUs' faults",
			s.Workload, s.Reason, s.SpannedGPUs, s.WorkloadGPUs, s.Last.Sub(s.First), s.Faults, s.First.UTC().Format(time.RFC3339))
	}
	r.signatures = f.Signatures
	if r.opts.Signatures != nil {
		r.opts.Signatures(len(f.Signatures))
	}
}

// seed takes the findings and signatures of a verdict published before (by another leader) as
// reported: they are not announced again, and their series are set.
func (r *reporter) seed(f Findings) {
	r.findings = make(map[string]sharedcause.Finding, len(f.SharedCauses))
	for _, c := range f.SharedCauses {
		r.findings[c.Attribute+"="+c.Value] = c
		r.finding(c, true)
	}
	r.signatures = f.Signatures
}

// known reports whether s is a signature already reported: of the same workload and reason,
// overlapping it in time (the earliest faults of a burst leave the window one by one).
func (r *reporter) known(s Signature) bool {
	for _, p := range r.signatures {
		if p.Workload == s.Workload && p.Reason == s.Reason && !s.First.After(p.Last) && !p.First.After(s.Last) {
			return true
		}
	}
	return false
}

// clear removes every metric series: the watcher stopped (this replica no longer leads).
func (r *reporter) clear() {
	for _, c := range r.findings {
		r.finding(c, false)
	}
	if r.opts.Signatures != nil {
		r.opts.Signatures(0)
	}
	r.findings, r.signatures = nil, nil
}

func (r *reporter) finding(c sharedcause.Finding, current bool) {
	if r.opts.Finding != nil {
		r.opts.Finding(c.Attribute, c.Value, current)
	}
}

func (r *reporter) event(cm *corev1.ConfigMap, eventtype, reason, format string, args ...any) {
	if r.opts.Recorder != nil {
		r.opts.Recorder.Eventf(cm, eventtype, reason, format, args...)
	}
}

func reasons(rs []sharedcause.ReasonCount) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s (%d)", r.Reason, r.Faults)
	}
	return strings.Join(parts, ", ")
}
