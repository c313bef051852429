package v1_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// GPU UUIDs as NVML writes them.
const (
	uuidA = "GPU-9277d399-0674-44a9-b64e-d85bb19ce2b0"
	uuidB = "GPU-0d5e1f7c-4a4b-4c1e-9a55-7ad3f2b7c001"
	uuidC = "GPU-5b0c6a53-1f0e-4d2a-8f43-0c9e2b6d7a11"
)

func TestXIDFaultsCarryAGPUsOwnUnhealthyXIDsToItsPeers(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("X", 3600))
	xid := func(code uint32, sev health.Severity, causedBy bool) health.Condition {
		return health.Condition{Type: health.ConditionXID, Code: code, Severity: sev, Reason: "XID", Since: t0, LastSeen: t0, CausedByPrevious: causedBy}
	}
	gpu := health.DeviceStatus{Device: health.Device{UUID: uuidA, Index: 3}, Health: health.Unhealthy, Conditions: []health.Condition{
		xid(149, health.Unhealthy, false),
		xid(79, health.Unhealthy, false),
		xid(45, health.Unhealthy, true), // another's consequence: never a root
		xid(63, health.Degraded, false), // not a fault that breaks a peer's link
		{Type: health.ConditionGPULost, Severity: health.Unhealthy, Since: t0},
	}}
	mig := health.DeviceStatus{Device: health.Device{UUID: "MIG-a", Index: 3, MIG: &health.MIGPlacement{ParentUUID: uuidA}},
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
	got, refused := gpuhealthv1.PeerFaults("rack7-n3", summaries)
	if refused != nil {
		t.Errorf("PeerFaults refused an agent's own report: %v", refused)
	}
	wantPeers := []health.PeerFault{
		{Node: "rack7-n3", UUID: uuidA, Index: 3, XID: 79, Since: t0.UTC()},
		{Node: "rack7-n3", UUID: uuidA, Index: 3, XID: 149, Since: t0.UTC()},
	}
	if !reflect.DeepEqual(got, wantPeers) {
		t.Errorf("PeerFaults\n got %+v\nwant %+v", got, wantPeers)
	}
}

func TestPeerFaultsSkipWhatNoAgentWrites(t *testing.T) {
	summaries, err := gpuhealthv1.ParseHealth(`{
		"` + uuidA + `": {"index": 0, "health": "Unhealthy", "xidFaults": [{"xid": 0, "since": "2026-03-04T05:06:07Z"}, {"xid": 79}]},
		"` + uuidB + `": {"index": 1, "health": "Unhealthy", "xidFaults": [{"xid": 48, "since": "2026-03-04T05:06:07Z"}]}
	}`)
	if err != nil {
		t.Fatal(err)
	}
	got, refused := gpuhealthv1.PeerFaults("n", summaries)
	if len(got) != 1 || got[0].UUID != uuidB || got[0].XID != 48 {
		t.Errorf("PeerFaults %+v, want %s's XID 48 alone", got, uuidB)
	}
	if refused == nil || !strings.Contains(refused.Error(), "XID 0") || !strings.Contains(refused.Error(), "no time") {
		t.Errorf("refused %v, want XID 0 and the fault with no time named", refused)
	}
}

// A peer's report is its own claim: an XID fault on a GPU the same report does not mark
// Unhealthy, or on a GPU whose UUID no NVML writes, is no fault to attribute an XID to.
func TestPeerFaultsTakeOnlyFaultsOfGPUsTheReportMarksUnhealthy(t *testing.T) {
	fault := `"xidFaults": [{"xid": 149, "since": "2026-03-04T05:06:07Z"}]`
	for _, tc := range []struct {
		name, uuid, health string
		taken              bool
		refusal            string
	}{
		{"an Unhealthy GPU", uuidA, "Unhealthy", true, ""},
		{"a Degraded GPU", uuidA, "Degraded", false, `is "Degraded", not Unhealthy`},
		{"a Healthy GPU", uuidA, "Healthy", false, `is "Healthy", not Unhealthy`},
		{"a GPU with no health", uuidA, "", false, `is "", not Unhealthy`},
		{"a health of a kilobyte", uuidA, strings.Repeat("U", 1024), false, `is "UUUUUUUUUUUUUUUU", not Unhealthy`},
		{"a UUID that is no UUID", "GPU-peer-2", "Unhealthy", false, `"GPU-peer-2" is no GPU UUID`},
		{"a 100 kB UUID", "GPU-" + strings.Repeat("a", 100_000), "Unhealthy", false, "(100004 bytes) is no GPU UUID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			summaries, err := gpuhealthv1.ParseHealth(`{"` + tc.uuid + `": {"index": 2, "health": "` + tc.health + `", ` + fault + `}}`)
			if err != nil {
				t.Fatal(err)
			}
			got, refused := gpuhealthv1.PeerFaults("nvl72-a-0", summaries)
			if taken := len(got) == 1; taken != tc.taken {
				t.Errorf("PeerFaults %+v, want the fault taken: %v", got, tc.taken)
			}
			switch {
			case tc.refusal == "" && refused != nil:
				t.Errorf("refused %v, want nothing refused", refused)
			case tc.refusal != "" && (refused == nil || !strings.Contains(refused.Error(), tc.refusal)):
				t.Errorf("refused %v, want it to say %q", refused, tc.refusal)
			case refused != nil && len(refused.Error()) > 512:
				t.Errorf("the refusal is %d bytes: a peer's text reaches the log unbounded", len(refused.Error()))
			}
		})
	}
}

func TestPeerFaultsNameTheFirstRefusalsAndCountTheRest(t *testing.T) {
	summaries := map[string]gpuhealthv1.GPUSummary{}
	for i := range 100 {
		uuid := fmt.Sprintf("%s%02x", uuidC[:len(uuidC)-2], i)
		summaries[uuid] = gpuhealthv1.GPUSummary{Index: i, Health: "Healthy", XIDFaults: []gpuhealthv1.XIDFault{{XID: 149, Since: time.Now()}}}
	}
	got, refused := gpuhealthv1.PeerFaults("n", summaries)
	if len(got) != 0 || refused == nil {
		t.Fatalf("PeerFaults %+v refused %v, want every fault refused", got, refused)
	}
	if !strings.Contains(refused.Error(), "not Unhealthy") || !strings.Contains(refused.Error(), "and 92 more refused peer faults") || len(refused.Error()) > 2048 {
		t.Errorf("refused (%d bytes): %v; want the first 8 named and 92 counted", len(refused.Error()), refused)
	}
}
