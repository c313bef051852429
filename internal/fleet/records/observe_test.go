package records

import (
	"strings"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestNodeObservations(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	since := t0.Add(time.Hour)
	summaries := map[string]gpuhealthv1.GPUSummary{
		"GPU-0": {Index: 0, Serial: "1650000000000", Model: "H100", Health: "Unhealthy", Since: &since,
			Reasons: []string{health.ReasonFaultReturnsAfterRepair},
			History: &gpuhealthv1.HistorySummary{Faults: 1, Resets: 1, Recent: []health.HistoryEntry{
				{Time: t0, Kind: health.HistoryFault, Reason: "XID79"}, {Time: t0.Add(time.Minute), Kind: health.HistoryReset}}},
			Validation: &gpuhealthv1.ValidationSummary{At: t0.Add(2 * time.Minute), Result: "passed", By: "dcgm: dcgmi"}},
		"GPU-1":       {Index: 1, Serial: "1650000000001", Health: "Healthy"},
		"GPU-2":       {Index: 2, Health: "Healthy"},                            // no serial: no record
		"GPU-3":       {Index: 3, Serial: "bad serial", Health: "Healthy"},      // refused
		"MIG-1":       {Index: 1, Serial: "1650000000001", ParentUUID: "GPU-1"}, // a MIG instance
		"MISSING-0:1": {Index: -1, Missing: true, Health: "Unhealthy"},
	}
	drains := []gpuhealthv1.DrainEntry{{UUID: "GPU-1", Drain: gpuhealthv1.Drain{Index: 1, Reason: strings.Repeat("r", 300), By: "ops", At: t0}}}
	obs, refused := nodeObservations("node-a", summaries, drains)
	if len(obs) != 2 || len(refused) != 1 {
		t.Fatalf("observations %v, refused %v", obs, refused)
	}
	o := obs["1650000000000"]
	kinds := map[gpurecord.EventKind]int{}
	for _, e := range o.Events {
		kinds[e.Kind]++
		if e.Node != "node-a" || e.Index != 0 {
			t.Errorf("event %+v not placed on node-a GPU 0", e)
		}
	}
	want := map[gpurecord.EventKind]int{gpurecord.EventFault: 1, gpurecord.EventReset: 1, gpurecord.EventValidation: 1, gpurecord.EventReplaceGPU: 1}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("%s events: %d, want %d (%+v)", k, kinds[k], n, o.Events)
		}
	}
	d := obs["1650000000001"]
	if len(d.Events) != 1 || d.Events[0].Kind != gpurecord.EventDrain || len(d.Events[0].Reason) != maxText || d.UUID != "GPU-1" {
		t.Fatalf("the drained GPU: %+v", d)
	}
	if obs["1650000000001"].HasEvents() != true || (gpurecord.Observation{}).HasEvents() {
		t.Fatal("HasEvents")
	}
}
