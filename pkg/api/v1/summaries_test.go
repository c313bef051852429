package v1_test

import (
	"slices"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestUnhealthyIndexesAndSummaries(t *testing.T) {
	t0 := time.Unix(100, 0).UTC()
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-3", Index: 3}, Health: health.Unhealthy, Conditions: []health.Condition{
			{Type: health.ConditionThermal, Severity: health.Degraded, Reason: "TemperatureAtSlowdown", Since: t0},
			{Type: health.ConditionXID, Code: 79, Severity: health.Unhealthy, Reason: "XID79", Since: t0.Add(time.Second)},
		}},
		{Device: health.Device{UUID: "GPU-0", Index: 0}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "MIG-1", Index: 1, MIG: &health.MIGPlacement{ParentUUID: "GPU-1"}}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "GPU-1", Index: 1}, Health: health.Degraded},
	}}
	got := gpuhealthv1.UnhealthyIndexes(snap)
	if len(got) != 2 || got[0] != 0 || got[1] != 3 {
		t.Errorf("UnhealthyIndexes = %v, want [0 3] (MIG instances do not count on their own)", got)
	}
	s := gpuhealthv1.Summarize(snap.Devices[0])
	if len(s.Reasons) != 2 || s.Reasons[0] != "XID79" || s.Since == nil || !s.Since.Equal(t0.Add(time.Second)) {
		t.Errorf("Summarize = %+v, want the worst reason first and its since", s)
	}
}

func TestSummaryListsWhatIsUnmonitored(t *testing.T) {
	d := health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, Unmonitored: true,
		UnmonitoredChecks: []health.Check{health.CheckECC, health.CheckRowRemap}}
	if got := gpuhealthv1.Summarize(d).Unmonitored; !slices.Equal(got, []string{"events", "ecc", "rowRemap"}) {
		t.Errorf("Unmonitored = %v", got)
	}
	if got := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-b"}}).Unmonitored; got != nil {
		t.Errorf("a fully watched GPU lists %v", got)
	}
}
