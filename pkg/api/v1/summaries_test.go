package v1_test

import (
	"encoding/json"
	"slices"
	"strings"
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

// A physical GPU's board serial reaches its summary, after its model; a MIG instance and a
// placeholder carry none, and a GPU without one has no serial field at all.
func TestSummaryCarriesThePhysicalGPUsSerial(t *testing.T) {
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a", Index: 0, Model: "H100", Serial: "1650923012345"}},
		{Device: health.Device{UUID: "MIG-a", Index: 0, Serial: "1650923012345", MIG: &health.MIGPlacement{ParentUUID: "GPU-a"}}},
		{Device: health.Device{UUID: "GPU-b", Index: 1}},
		{Device: health.Device{UUID: "MISSING-0000:07:00.0", Index: -1, Serial: "x", Missing: true}},
	}}
	sums := gpuhealthv1.Summaries(snap)
	for uuid, want := range map[string]string{"GPU-a": "1650923012345", "MIG-a": "", "GPU-b": "", "MISSING-0000:07:00.0": ""} {
		if got := sums[uuid].Serial; got != want {
			t.Errorf("%s: serial %q, want %q", uuid, got, want)
		}
	}
	raw, err := json.Marshal(sums["GPU-a"])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"index":0,"model":"H100","serial":"1650923012345","health":"Healthy"}`; string(raw) != want {
		t.Errorf("GPU-a's summary is %s, want %s", raw, want)
	}
	if raw, _ := json.Marshal(sums["GPU-b"]); strings.Contains(string(raw), "serial") {
		t.Errorf("a GPU without a serial: %s", raw)
	}
	back, err := gpuhealthv1.ParseHealth(`{"GPU-a":{"index":0,"serial":"1650923012345","health":"Healthy"}}`)
	if err != nil || back["GPU-a"].Serial != "1650923012345" {
		t.Errorf("ParseHealth = %+v, %v; want the serial back", back, err)
	}
}

// A physical GPU's VBIOS version reaches its summary, right after its serial; a MIG instance and
// a placeholder carry none, and a GPU without one has no vbios field at all.
func TestSummaryCarriesThePhysicalGPUsVBIOS(t *testing.T) {
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a", Index: 0, Model: "H100", Serial: "1650923012345", VBIOS: "96.00.89.00.01"}},
		{Device: health.Device{UUID: "MIG-a", Index: 0, VBIOS: "96.00.89.00.01", MIG: &health.MIGPlacement{ParentUUID: "GPU-a"}}},
		{Device: health.Device{UUID: "GPU-b", Index: 1}},
		{Device: health.Device{UUID: "MISSING-0000:07:00.0", Index: -1, VBIOS: "x", Missing: true}},
	}}
	sums := gpuhealthv1.Summaries(snap)
	for uuid, want := range map[string]string{"GPU-a": "96.00.89.00.01", "MIG-a": "", "GPU-b": "", "MISSING-0000:07:00.0": ""} {
		if got := sums[uuid].VBIOS; got != want {
			t.Errorf("%s: VBIOS %q, want %q", uuid, got, want)
		}
	}
	raw, err := json.Marshal(sums["GPU-a"])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"index":0,"model":"H100","serial":"1650923012345","vbios":"96.00.89.00.01","health":"Healthy"}`; string(raw) != want {
		t.Errorf("GPU-a's summary is %s, want %s", raw, want)
	}
	if raw, _ := json.Marshal(sums["GPU-b"]); strings.Contains(string(raw), "vbios") {
		t.Errorf("a GPU without a VBIOS version: %s", raw)
	}
	back, err := gpuhealthv1.ParseHealth(`{"GPU-a":{"index":0,"vbios":"96.00.89.00.01","health":"Healthy"}}`)
	if err != nil || back["GPU-a"].VBIOS != "96.00.89.00.01" {
		t.Errorf("ParseHealth = %+v, %v; want the VBIOS version back", back, err)
	}
}
