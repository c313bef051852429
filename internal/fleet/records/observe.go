package records

import (
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// maxText bounds a reason or a "by" a record keeps (the CRD's limit): a drain's reason is an
// operator's free text.
const maxText = 256

// nodeObservations returns what one node's report says of each of its physical GPUs with a
// valid serial, and the serials it refused. summaries is the node's gpu-health annotation,
// drains its gpu-drains annotation.
func nodeObservations(node string, summaries map[string]gpuhealthv1.GPUSummary, drains []gpuhealthv1.DrainEntry) (map[string]gpurecord.Observation, []string) {
	drained := make(map[string]gpuhealthv1.Drain, len(drains))
	for _, d := range drains {
		drained[d.UUID] = d.Drain
	}
	out := map[string]gpurecord.Observation{}
	var refused []string
	for uuid, s := range summaries {
		if s.Missing || s.ParentUUID != "" || s.Serial == "" || s.Index < 0 {
			continue
		}
		if err := gpurecord.ValidateSerial(s.Serial); err != nil {
			refused = append(refused, gpuhealthv1.Short(s.Serial))
			continue
		}
		o := gpurecord.Observation{Node: node, Index: s.Index, UUID: uuid, Model: bounded(s.Model), Events: events(node, s)}
		if d, ok := drained[uuid]; ok && !d.At.IsZero() {
			o.Events = append(o.Events, gpurecord.Event{Time: metav1.NewTime(d.At), Kind: gpurecord.EventDrain, Reason: bounded(d.Reason), By: bounded(d.By), Node: node, Index: s.Index})
		}
		if prev, dup := out[s.Serial]; dup && prev.UUID < uuid {
			continue // one serial twice on a node: a report no GPU makes; keep one, the same each time
		}
		out[s.Serial] = o
	}
	slices.Sort(refused)
	return out, refused
}

// events are a GPU summary's history entries, its last validation and its escalation.
func events(node string, s gpuhealthv1.GPUSummary) []gpurecord.Event {
	var out []gpurecord.Event
	add := func(at time.Time, kind gpurecord.EventKind, reason, by string) {
		if !at.IsZero() {
			out = append(out, gpurecord.Event{Time: metav1.NewTime(at), Kind: kind, Reason: bounded(reason), By: bounded(by), Node: node, Index: s.Index})
		}
	}
	if s.History != nil {
		for _, e := range s.History.Recent {
			switch e.Kind {
			case health.HistoryFault, health.HistoryReset, health.HistoryReboot, health.HistoryCleared:
				add(e.Time, gpurecord.EventKind(e.Kind), e.Reason, e.By)
			}
		}
	}
	if v := s.Validation; v != nil {
		add(v.At, gpurecord.EventValidation, v.Result, v.By)
	}
	if s.Since != nil && slices.Contains(s.Reasons, health.ReasonFaultReturnsAfterRepair) {
		add(*s.Since, gpurecord.EventReplaceGPU, health.ReasonFaultReturnsAfterRepair, "")
	}
	return out
}

func bounded(s string) string {
	if len(s) <= maxText {
		return s
	}
	return strings.ToValidUTF8(s[:maxText], "")
}
