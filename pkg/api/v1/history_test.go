package v1_test

import (
	"strconv"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestSummarizeHistory(t *testing.T) {
	if s := gpuhealthv1.SummarizeHistory(nil); s != nil || s.String() != "<none>" {
		t.Errorf("no history: %+v %q", s, s.String())
	}
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600))
	var h []health.HistoryEntry
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Hour)
		h = append(h, health.HistoryEntry{Time: at, Kind: health.HistoryFault, Reason: "XID48"},
			health.HistoryEntry{Time: at.Add(time.Minute), Kind: health.HistoryReset})
	}
	h = append(h, health.HistoryEntry{Time: t0.Add(4 * time.Hour), Kind: health.HistoryReboot})
	s := gpuhealthv1.SummarizeHistory(h)
	if s.Faults != 3 || s.Resets != 3 || s.Reboots != 1 || s.String() != "3 faults, 3 resets, 1 reboot" {
		t.Errorf("summary %+v %q", s, s.String())
	}
	if want := min(len(h), gpuhealthv1.MaxRecentHistory); len(s.Recent) != want || s.Recent[len(s.Recent)-1].Kind != health.HistoryReboot ||
		s.Recent[0].Time.Location() != time.UTC {
		t.Errorf("recent %+v, want the newest %d entries in UTC", s.Recent, want)
	}
	// A long history: the counts are of every entry, the annotation carries the newest.
	var long []health.HistoryEntry
	for i := range 20 {
		long = append(long, health.HistoryEntry{Time: t0.Add(time.Duration(i) * time.Hour), Kind: health.HistoryFault, Reason: "XID" + strconv.Itoa(i)})
	}
	first := "XID" + strconv.Itoa(20-gpuhealthv1.MaxRecentHistory)
	if s := gpuhealthv1.SummarizeHistory(long); s.Faults != 20 || len(s.Recent) != gpuhealthv1.MaxRecentHistory ||
		s.Recent[0].Reason != first || s.Recent[len(s.Recent)-1].Reason != "XID19" {
		t.Errorf("a history of 20: %d faults, recent %+v; want 20, the newest %d (%s..XID19)", s.Faults, s.Recent, gpuhealthv1.MaxRecentHistory, first)
	}
	// The summary reaches the annotation's GPU summary.
	sum := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, History: h})
	if sum.History == nil || sum.History.Faults != 3 {
		t.Errorf("Summarize: history %+v", sum.History)
	}
}

func TestMissingGPUsAreInTheSummaryButInNoIndexList(t *testing.T) {
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a", Index: 0}, Health: health.Unhealthy},
		{Device: health.Device{UUID: "MISSING-0000:07:00.0", Index: -1, PCIBusID: "0000:07:00.0", Missing: true}, Health: health.Unhealthy},
	}}
	if got := gpuhealthv1.UnhealthyIndexes(snap); len(got) != 1 || got[0] != 0 {
		t.Errorf("UnhealthyIndexes = %v, want [0]: a missing GPU has no index", got)
	}
	if s := gpuhealthv1.Summarize(snap.Devices[1]); !s.Missing || s.Index != -1 || s.Health != "Unhealthy" {
		t.Errorf("summary %+v", s)
	}
}

func TestTheLastValidationIsInTheSummaryNotInTheHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.FixedZone("X", 3600))
	h := []health.HistoryEntry{
		{Time: t0, Kind: health.HistoryFault, Reason: "XID48"},
		{Time: t0.Add(time.Minute), Kind: health.HistoryReset},
		{Time: t0.Add(3 * time.Minute), Kind: health.HistoryValidation, Reason: "failed", By: "dcgm: dcgmi diag"},
		{Time: t0.Add(5 * time.Minute), Kind: health.HistoryReset},
		{Time: t0.Add(7 * time.Minute), Kind: health.HistoryValidation, Reason: "passed", By: "dcgm: dcgmi diag"},
	}
	sum := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, History: h})
	if v := sum.Validation; v == nil || v.Result != "passed" || v.By != "dcgm: dcgmi diag" || !v.At.Equal(t0.Add(7*time.Minute)) || v.At.Location() != time.UTC {
		t.Errorf("validation %+v, want the newest verdict (passed) in UTC", v)
	}
	if s := sum.History; s == nil || s.Faults != 1 || s.Resets != 2 || len(s.Recent) != 3 {
		t.Errorf("history %+v: validations are neither faults nor repairs, nor recent entries", s)
	}
	// A GPU returned without a test says so.
	passive := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-b"}, History: []health.HistoryEntry{
		{Time: t0, Kind: health.HistoryValidation, Reason: string(health.ValidationPassive), By: "probation"}}})
	if passive.Validation == nil || passive.Validation.Result != "passive" || passive.History != nil {
		t.Errorf("passive return: validation %+v, history %+v", passive.Validation, passive.History)
	}
	if none := gpuhealthv1.Summarize(health.DeviceStatus{Device: health.Device{UUID: "GPU-c"}}); none.Validation != nil {
		t.Errorf("a GPU never repaired has validation %+v", none.Validation)
	}
}
