package v1_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestXIDFaultsCarryAGPUsOwnUnhealthyXIDsToItsPeers(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", 3600))
	xid := func(code uint32, sev health.Severity, causedBy bool) health.Condition {
		return health.Condition{Type: health.ConditionXID, Code: code, Severity: sev, Reason: "XID", Since: t0, LastSeen: t0, CausedByPrevious: causedBy}
	}
	gpu := health.DeviceStatus{Device: health.Device{UUID: "GPU-a", Index: 3}, Health: health.Unhealthy, Conditions: []health.Condition{
		xid(149, health.Unhealthy, false),
		xid(79, health.Unhealthy, false),
		xid(45, health.Unhealthy, true), // another's consequence: never a root
		xid(63, health.Degraded, false), // not a fault that breaks a peer's link
		{Type: health.ConditionGPULost, Severity: health.Unhealthy, Since: t0},
	}}
	mig := health.DeviceStatus{Device: health.Device{UUID: "MIG-a", Index: 3, MIG: &health.MIGPlacement{ParentUUID: "GPU-a"}},
		Health: health.Unhealthy, Conditions: []health.Condition{xid(149, health.Unhealthy, false)}}
	missing := health.DeviceStatus{Device: health.Device{UUID: "MISSING-0000:09:00.0", Index: -1, Missing: true},
		Health: health.Unhealthy, Conditions: []health.Condition{xid(79, health.Unhealthy, false)}}
	snap := health.Snapshot{Devices: []health.DeviceStatus{gpu, mig, missing}}

	s := gpuhealthv1.Summarize(gpu)
	want := []gpuhealthv1.XIDFault{{XID: 79, Since: t0.UTC()}, {XID: 149, Since: t0.UTC()}}
	if !reflect.DeepEqual(s.XIDFaults, want) {
		t.Errorf("XIDFaults %+v, want %+v", s.XIDFaults, want)
	}
	if m := gpuhealthv1.Summarize(mig); m.XIDFaults != nil {
		t.Errorf("a MIG instance carries XID faults %+v: its GPU's summary does", m.XIDFaults)
	}

	// Through the annotation's JSON, as a peer's agent reads it.
	raw, err := json.Marshal(gpuhealthv1.Summaries(snap))
	if err != nil {
		t.Fatal(err)
	}
	summaries, err := gpuhealthv1.ParseHealth(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	got := gpuhealthv1.PeerFaults("rack7-n3", summaries)
	wantPeers := []health.PeerFault{
		{Node: "rack7-n3", UUID: "GPU-a", Index: 3, XID: 79, Since: t0.UTC()},
		{Node: "rack7-n3", UUID: "GPU-a", Index: 3, XID: 149, Since: t0.UTC()},
	}
	if !reflect.DeepEqual(got, wantPeers) {
		t.Errorf("PeerFaults\n got %+v\nwant %+v", got, wantPeers)
	}
}

func TestPeerFaultsSkipWhatNoAgentWrites(t *testing.T) {
	summaries, err := gpuhealthv1.ParseHealth(`{
		"GPU-a": {"index": 0, "health": "Unhealthy", "xidFaults": [{"xid": 0, "since": "2026-03-04T05:06:07Z"}, {"xid": 79}]},
		"GPU-b": {"index": 1, "health": "Unhealthy", "xidFaults": [{"xid": 48, "since": "2026-03-04T05:06:07Z"}]}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got := gpuhealthv1.PeerFaults("n", summaries)
	if len(got) != 1 || got[0].UUID != "GPU-b" || got[0].XID != 48 {
		t.Errorf("PeerFaults %+v, want GPU-b's XID 48 alone", got)
	}
}
