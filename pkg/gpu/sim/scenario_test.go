package sim_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

const scenarioHeader = "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n"

// scenario builds a scenario file: the header, gpus (count 4 with MIG instances on GPU 1 unless
// gpus is given) and the events, one per line.
func scenario(gpus string, events ...string) string {
	if gpus == "" {
		gpus = "gpus: {count: 4, migInstances: {\"1\": 2}}\n"
	}
	var b strings.Builder
	b.WriteString(scenarioHeader + "node: n1\n" + gpus)
	if len(events) > 0 {
		b.WriteString("events:\n")
		for _, e := range events {
			b.WriteString("  - " + e + "\n")
		}
	}
	return b.String()
}

func mustParseScenario(t *testing.T, data string) *sim.Scenario {
	t.Helper()
	sc, err := sim.ParseScenario([]byte(data))
	if err != nil {
		t.Fatalf("ParseScenario: %v\n%s", err, data)
	}
	return sc
}

func ptr[T any](v T) *T { return &v }

func TestParseTheIssueExample(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("testdata", "issue-example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Node != "sim-node-0" || sc.GPUCount != 8 || sc.Model != "NVIDIA H100 80GB HBM3" || len(sc.MIGInstances) != 0 || sc.Duration != 0 {
		t.Fatalf("scenario header %+v", sc)
	}
	want := []sim.Event{
		{At: 0, Line: 10, Kind: sim.EventXID, GPU: 3, Repeat: 1, XID: 79},
		{At: 5 * time.Second, Line: 14, Kind: sim.EventECC, GPU: 2, Repeat: 1, UncorrectedIncrease: 1},
		{At: 6 * time.Second, Line: 15, Kind: sim.EventECC, GPU: 4, Repeat: 1, CorrectedIncrease: 5000},
		{At: 7 * time.Second, Line: 16, Kind: sim.EventRemappedRows, GPU: 1, Repeat: 1, RowsPending: ptr(true)},
		{At: 8 * time.Second, Line: 17, Kind: sim.EventTemperature, GPU: 5, Repeat: 1, TemperatureC: 97},
		{At: 9 * time.Second, Line: 18, Kind: sim.EventClockEventReasons, GPU: 6, Repeat: 1, ClockEventReasons: health.ClockEventHWSlowdown},
		{At: 9 * time.Second, Line: 19, Kind: sim.EventPCIeReplays, GPU: 7, Repeat: 1, PCIeReplaysIncrease: 500},
		{At: 9 * time.Second, Line: 20, Kind: sim.EventNVLink, GPU: 0, Repeat: 1, Link: 2, LinkDown: ptr(true)},
		{At: 10 * time.Second, Line: 21, Kind: sim.EventRecoveryAction, GPU: 0, Repeat: 1, RecoveryAction: health.RecoveryGPUReset},
		{At: 11 * time.Second, Line: 22, Kind: sim.EventLost, GPU: 2, Repeat: 1},
		{At: 60 * time.Second, Line: 23, Kind: sim.EventReset, GPU: 3, Repeat: 1},
		{At: 90 * time.Second, Line: 24, Kind: sim.EventReboot, GPU: -1, Repeat: 1},
	}
	if len(sc.Events) != len(want) {
		t.Fatalf("%d events, want %d", len(sc.Events), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(sc.Events[i], want[i]) {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, sc.Events[i], want[i])
		}
	}
}

func TestTheBundledExampleParses(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "..", "..", "examples", "scenario.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Duration != time.Hour || sc.MIGInstances[7] != 3 {
		t.Fatalf("example: duration %v, MIG %v", sc.Duration, sc.MIGInstances)
	}
}

func TestDefaults(t *testing.T) {
	sc := mustParseScenario(t, scenarioHeader+"gpus: {count: 1}\nevents:\n  - {at: 1s, gpu: 0, xid: 13}\n")
	if sc.Node != sim.DefaultNode || sc.Model != sim.DefaultModel || sc.Duration != 0 || len(sc.MIGInstances) != 0 {
		t.Fatalf("defaults %+v", sc)
	}
	if sc.Events[0].Repeat != 1 || sc.Events[0].MIG != 0 || sc.Events[0].GPUInstance != nil {
		t.Fatalf("event defaults %+v", sc.Events[0])
	}
	// No events at all is a scenario too: a quiet node.
	if sc := mustParseScenario(t, scenarioHeader+"gpus: {count: 2}\n"); len(sc.Events) != 0 {
		t.Fatalf("events %+v", sc.Events)
	}
}

func TestEveryEventKind(t *testing.T) {
	cases := []struct {
		name  string
		event string
		want  sim.Event
	}{
		{"xid", "{at: 1s, gpu: 2, xid: 48}", sim.Event{Kind: sim.EventXID, GPU: 2, XID: 48}},
		{"xid storm", "{at: 1s, gpu: 2, xid: 31, repeat: 10000}", sim.Event{Kind: sim.EventXID, GPU: 2, XID: 31, Repeat: 10000}},
		{"xid scoped to a GPU instance", "{at: 1s, gpu: 1, xid: 62, gpuInstance: 2}",
			sim.Event{Kind: sim.EventXID, GPU: 1, XID: 62, GPUInstance: ptr[uint32](2)}},
		{"xid scoped to a compute instance", "{at: 1s, gpu: 1, xid: 62, gpuInstance: 2, computeInstance: 0}",
			sim.Event{Kind: sim.EventXID, GPU: 1, XID: 62, GPUInstance: ptr[uint32](2), ComputeInstance: ptr[uint32](0)}},
		{"ecc uncorrected", "{at: 1s, gpu: 0, ecc: {uncorrectedVolatile: 2}}", sim.Event{Kind: sim.EventECC, UncorrectedIncrease: 2}},
		{"ecc corrected", "{at: 1s, gpu: 0, ecc: {correctedVolatile: 5000}}", sim.Event{Kind: sim.EventECC, CorrectedIncrease: 5000}},
		{"ecc both", "{at: 1s, gpu: 0, ecc: {correctedVolatile: 3, uncorrectedVolatile: 4}}", sim.Event{Kind: sim.EventECC, CorrectedIncrease: 3, UncorrectedIncrease: 4}},
		{"rows pending", "{at: 1s, gpu: 0, remappedRows: {pending: true}}", sim.Event{Kind: sim.EventRemappedRows, RowsPending: ptr(true)}},
		{"rows failure", "{at: 1s, gpu: 0, remappedRows: {failure: true}}", sim.Event{Kind: sim.EventRemappedRows, RowsFailure: ptr(true)}},
		{"rows cleared", "{at: 1s, gpu: 0, remappedRows: {pending: false, failure: false}}", sim.Event{Kind: sim.EventRemappedRows, RowsPending: ptr(false), RowsFailure: ptr(false)}},
		{"retired pages", "{at: 1s, gpu: 0, retiredPages: {pending: true}}", sim.Event{Kind: sim.EventRetiredPages, PagesPending: true}},
		{"temperature", "{at: 1s, gpu: 0, temperatureC: 97}", sim.Event{Kind: sim.EventTemperature, TemperatureC: 97}},
		{"cold temperature", "{at: 1s, gpu: 0, temperatureC: -10}", sim.Event{Kind: sim.EventTemperature, TemperatureC: -10}},
		{"clock reasons", "{at: 1s, gpu: 0, clockEventReasons: [hwSlowdown, hwThermalSlowdown, hwPowerBrake, swThermalSlowdown]}",
			sim.Event{Kind: sim.EventClockEventReasons, ClockEventReasons: health.ClockEventHWSlowdown | health.ClockEventHWThermalSlowdown | health.ClockEventHWPowerBrake | health.ClockEventSWThermalSlowdown}},
		{"clock reasons cleared", "{at: 1s, gpu: 0, clockEventReasons: []}", sim.Event{Kind: sim.EventClockEventReasons}},
		{"pcie replays", "{at: 1s, gpu: 0, pcieReplays: 500}", sim.Event{Kind: sim.EventPCIeReplays, PCIeReplaysIncrease: 500}},
		{"nvlink down", "{at: 1s, gpu: 0, nvlink: {link: 2, down: true}}", sim.Event{Kind: sim.EventNVLink, Link: 2, LinkDown: ptr(true)}},
		{"nvlink up", "{at: 1s, gpu: 0, nvlink: {link: 17, down: false}}", sim.Event{Kind: sim.EventNVLink, Link: 17, LinkDown: ptr(false)}},
		{"nvlink errors", "{at: 1s, gpu: 0, nvlink: {link: 0, crcErrors: 100}}", sim.Event{Kind: sim.EventNVLink, Link: 0, LinkErrorsIncrease: 100}},
		{"recovery none", "{at: 1s, gpu: 0, recoveryAction: none}", sim.Event{Kind: sim.EventRecoveryAction, RecoveryAction: health.RecoveryNone}},
		{"recovery gpuReset", "{at: 1s, gpu: 0, recoveryAction: gpuReset}", sim.Event{Kind: sim.EventRecoveryAction, RecoveryAction: health.RecoveryGPUReset}},
		{"recovery nodeReboot", "{at: 1s, gpu: 0, recoveryAction: nodeReboot}", sim.Event{Kind: sim.EventRecoveryAction, RecoveryAction: health.RecoveryNodeReboot}},
		{"recovery drainP2P", "{at: 1s, gpu: 0, recoveryAction: drainP2P}", sim.Event{Kind: sim.EventRecoveryAction, RecoveryAction: health.RecoveryDrainP2P}},
		{"recovery drainAndReset", "{at: 1s, gpu: 0, recoveryAction: drainAndReset}", sim.Event{Kind: sim.EventRecoveryAction, RecoveryAction: health.RecoveryDrainAndReset}},
		{"lost", "{at: 1s, gpu: 0, lost: true}", sim.Event{Kind: sim.EventLost}},
		{"reset", "{at: 1s, gpu: 0, reset: true}", sim.Event{Kind: sim.EventReset}},
		{"reboot", "{at: 1s, reboot: true}", sim.Event{Kind: sim.EventReboot, GPU: -1}},
		{"peer fault", "{at: 1s, peerFault: {node: n0, gpu: 2, xid: 149}}", sim.Event{Kind: sim.EventPeerFault, GPU: -1,
			Peer: health.PeerFault{Node: "n0", UUID: sim.GPUUUID("n0", 2), Index: 2, XID: 149}}},
		{"peer fault cleared, its UUID given", "{at: 1s, peerFault: {node: n0, gpu: 2, uuid: GPU-x, xid: 149, cleared: true}}",
			sim.Event{Kind: sim.EventPeerFault, GPU: -1, Peer: health.PeerFault{Node: "n0", UUID: "GPU-x", Index: 2, XID: 149}, PeerCleared: true}},
		{"a duration with several units", "{at: 1h2m3.5s, gpu: 0, reset: true}", sim.Event{At: time.Hour + 2*time.Minute + 3500*time.Millisecond, Kind: sim.EventReset}},
		{"a quoted duration", "{at: \"250ms\", gpu: 0, reset: true}", sim.Event{At: 250 * time.Millisecond, Kind: sim.EventReset}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc := mustParseScenario(t, scenario("", tc.event))
			want := tc.want
			if want.At == 0 {
				want.At = time.Second
			}
			if want.Repeat == 0 {
				want.Repeat = 1
			}
			want.Line = 6
			if got := sc.Events[0]; !reflect.DeepEqual(got, want) {
				t.Fatalf("event\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestGPUByIndexOrUUID(t *testing.T) {
	cases := []struct {
		name     string
		gpu      string
		wantGPU  int
		wantMIG  int
		kind     string
		wantFail string
	}{
		{name: "index", gpu: "3", wantGPU: 3},
		{name: "quoted index", gpu: `"2"`, wantGPU: 2},
		{name: "GPU UUID", gpu: sim.GPUUUID("n1", 2), wantGPU: 2},
		{name: "GPU UUID in upper case", gpu: strings.ToUpper(sim.GPUUUID("n1", 0)), wantGPU: 0},
		{name: "MIG UUID", gpu: sim.MIGUUID("n1", 1, 2), wantGPU: 1, wantMIG: 2},
		{name: "UUID of another node", gpu: sim.GPUUUID("other", 2), wantFail: "no GPU or MIG instance has UUID"},
		{name: "UUID of a GPU past the count", gpu: sim.GPUUUID("n1", 4), wantFail: "no GPU or MIG instance has UUID"},
		{name: "MIG UUID past the instance count", gpu: sim.MIGUUID("n1", 1, 3), wantFail: "no GPU or MIG instance has UUID"},
		{name: "MIG UUID of a GPU without MIG", gpu: sim.MIGUUID("n1", 0, 1), wantFail: "no GPU or MIG instance has UUID"},
		{name: "MIG UUID for a fault of the physical GPU", gpu: sim.MIGUUID("n1", 1, 1), kind: "temperatureC: 99", wantFail: "name GPU 1 instead"},
		{name: "index out of range", gpu: "4", wantFail: "gpu: index 4 is out of range"},
		{name: "negative index", gpu: "-1", wantFail: "gpu: index -1 is out of range"},
		{name: "empty string", gpu: `""`, wantFail: `gpu "" is neither an index nor a UUID`},
		{name: "a list", gpu: "[0]", wantFail: "gpu must be an index or a UUID"},
		{name: "a hexadecimal number", gpu: "0x10", wantFail: `gpu "0x10" is neither an index nor a UUID`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kind := tc.kind
			if kind == "" {
				kind = "xid: 48"
			}
			data := scenario("", fmt.Sprintf("{at: 1s, gpu: %s, %s}", tc.gpu, kind))
			sc, err := sim.ParseScenario([]byte(data))
			if tc.wantFail != "" {
				wantOneLineError(t, err, "line 6", tc.wantFail)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ev := sc.Events[0]; ev.GPU != tc.wantGPU || ev.MIG != tc.wantMIG {
				t.Fatalf("GPU %d MIG %d, want %d/%d", ev.GPU, ev.MIG, tc.wantGPU, tc.wantMIG)
			}
		})
	}
}

func TestEventsAreSortedStablyByTime(t *testing.T) {
	sc := mustParseScenario(t, scenario("",
		"{at: 1m, gpu: 0, xid: 1}",
		"{at: 5s, gpu: 0, xid: 2}",
		"{at: 1m, gpu: 0, xid: 3}",
		"{at: 0s, gpu: 0, xid: 4}",
		"{at: 60s, gpu: 0, xid: 5}",
		"{at: 5s, gpu: 0, xid: 6}",
		"{at: 1m, reboot: true}",
	))
	var got []string
	for _, e := range sc.Events {
		got = append(got, fmt.Sprintf("%v/%s%d@%d", e.At, e.Kind, e.XID, e.Line))
	}
	want := []string{"0s/xid4@9", "5s/xid2@7", "5s/xid6@11", "1m0s/xid1@6", "1m0s/xid3@8", "1m0s/xid5@10", "1m0s/reboot0@12"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order %q, want %q", got, want)
	}
}

func TestScenarioErrors(t *testing.T) {
	cases := []struct {
		name string
		data string
		want []string // substrings of the one-line error: the field and/or the line
	}{
		{"empty file", "", []string{"empty"}},
		{"only comments", "# nothing here\n", []string{"empty"}},
		{"two YAML documents", scenario("") + "---\n" + scenario(""), []string{"only one YAML document", "line"}},
		{"not YAML", scenarioHeader + "gpus: {count: 4\n", []string{"line"}},
		{"a list", "- 1\n", []string{"line 1"}},
		{"wrong apiVersion", "apiVersion: v1\nkind: Scenario\ngpus: {count: 1}\n", []string{"apiVersion", `"v1"`}},
		{"wrong kind", "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\ngpus: {count: 1}\n", []string{"kind", `"HealthConfig"`}},
		{"unknown top-level field", scenario("") + "evnts: []\n", []string{`unknown field "evnts"`, "line 5"}},
		{"unknown field in gpus", scenarioHeader + "gpus: {count: 1, modelz: x}\n", []string{`unknown field "modelz"`, "line 3"}},
		{"unknown field in an event", scenario("", "{at: 1s, gpu: 0, xid: 48, times: 2}"), []string{`unknown field "times"`, "line 6"}},
		{"unknown field in ecc", scenario("", "{at: 1s, gpu: 0, ecc: {dbe: 1}}"), []string{`unknown field "dbe"`, "line 6"}},
		{"missing GPU out of range", scenario("gpus: {count: 2, missing: [2]}\n"), []string{"gpus.missing[0]: must be a GPU index from 0 to 1, got 2"}},
		{"every GPU missing", scenario("gpus: {count: 2, missing: [0, 1]}\n"), []string{"gpus.missing: every GPU is missing"}},
		{"an event about a missing GPU", scenario("gpus: {count: 2, missing: [1]}\n", "{at: 1s, gpu: 1, xid: 48}"), []string{"GPU 1 is in gpus.missing", "line 6"}},
		{"xid severity unknown", scenario("", "{at: 1s, gpu: 0, xid: 145, xidSeverity: Bad}"), []string{"xidSeverity: want Fatal or Nonfatal", "line 6"}},
		{"xid qualifier without an xid", scenario("", "{at: 1s, gpu: 0, temperatureC: 80, causedByPrevious: true}"), []string{"only qualify an xid", "line 6"}},
		{"duplicate field in an event", scenario("", "{at: 1s, at: 2s, gpu: 0, xid: 48}"), []string{"line 6", `"at"`}},
		{"missing gpus", scenarioHeader, []string{"gpus.count: required"}},
		{"missing count", scenarioHeader + "gpus: {model: x}\n", []string{"gpus.count: required"}},
		{"count 0", scenarioHeader + "gpus: {count: 0}\n", []string{"gpus.count", "got 0"}},
		{"count 65", scenarioHeader + "gpus: {count: 65}\n", []string{"gpus.count", "got 65"}},
		{"count negative", scenarioHeader + "gpus: {count: -3}\n", []string{"gpus.count", "got -3"}},
		{"count not a number", scenarioHeader + "gpus: {count: eight}\n", []string{"line 3", `"eight"`}},
		{"count a fraction", scenarioHeader + "gpus: {count: 1.5}\n", []string{"line 3", `"1.5" is not a whole number`}},
		{"MIG key not an index", scenario("gpus: {count: 2, migInstances: {x: 1}}\n"), []string{"gpus.migInstances", `"x"`}},
		{"MIG key out of range", scenario("gpus: {count: 2, migInstances: {\"2\": 1}}\n"), []string{"gpus.migInstances", `"2"`}},
		{"MIG key negative", scenario("gpus: {count: 2, migInstances: {\"-1\": 1}}\n"), []string{"gpus.migInstances", `"-1"`}},
		{"MIG count 0", scenario("gpus: {count: 2, migInstances: {\"1\": 0}}\n"), []string{`gpus.migInstances["1"]`, "got 0"}},
		{"MIG count 8", scenario("gpus: {count: 2, migInstances: {\"1\": 8}}\n"), []string{`gpus.migInstances["1"]`, "got 8"}},
		{"MIG count not a number", scenario("gpus: {count: 2, migInstances: {\"1\": all}}\n"), []string{"line 4", `"all"`}},
		{"missing at", scenario("", "{gpu: 0, xid: 48}"), []string{"events[0] (line 6)", "at: required"}},
		{"at without a unit", scenario("", "{at: 5, gpu: 0, xid: 48}"), []string{"line 6", `"5"`, "unit"}},
		{"at as a word", scenario("", "{at: soon, gpu: 0, xid: 48}"), []string{"line 6", `"soon"`}},
		{"at negative", scenario("", "{at: 1s, gpu: 0, xid: 13}", "{at: -5s, gpu: 0, xid: 48}"), []string{"events[1] (line 7)", "at: must not be negative"}},
		{"missing gpu", scenario("", "{at: 1s, xid: 48}"), []string{"events[0] (line 6)", "gpu: required"}},
		{"two kinds in one event", scenario("", "{at: 1s, gpu: 0, xid: 48, reset: true}"), []string{"events[0] (line 6)", "xid and reset in one event"}},
		{"no kind", scenario("", "{at: 1s, gpu: 0}"), []string{"events[0] (line 6)", "no fault or repair"}},
		{"null event", scenario("", "~"), []string{"events[0] (line 6)", "empty"}},
		{"bare dash", scenario("", "{at: 1s, gpu: 0, xid: 13}", "", "{at: -1s, gpu: 0, xid: 13}"), []string{"events[1] (line 7)", "empty"}},
		{"repeat 0", scenario("", "{at: 1s, gpu: 0, xid: 48, repeat: 0}"), []string{"events[0] (line 6)", "repeat", "got 0"}},
		{"repeat too large", scenario("", "{at: 1s, gpu: 0, xid: 48, repeat: 10000001}"), []string{"events[0] (line 6)", "repeat", "got 10000001"}},
		{"xid 0", scenario("", "{at: 1s, gpu: 0, xid: 0}"), []string{"events[0] (line 6)", "xid"}},
		{"xid negative", scenario("", "{at: 1s, gpu: 0, xid: -1}"), []string{"line 6", `"-1"`}},
		{"xid too large", scenario("", "{at: 1s, gpu: 0, xid: 4294967296}"), []string{"line 6", `"4294967296"`}},
		{"ecc without counters", scenario("", "{at: 1s, gpu: 0, ecc: {}}"), []string{"events[0] (line 6)", "ecc"}},
		{"ecc negative", scenario("", "{at: 1s, gpu: 0, ecc: {correctedVolatile: -5}}"), []string{"line 6", `"-5"`}},
		{"remappedRows without flags", scenario("", "{at: 1s, gpu: 0, remappedRows: {}}"), []string{"events[0] (line 6)", "remappedRows"}},
		{"retiredPages without pending", scenario("", "{at: 1s, gpu: 0, retiredPages: {}}"), []string{"events[0] (line 6)", "retiredPages"}},
		{"temperature implausible", scenario("", "{at: 1s, gpu: 0, temperatureC: 500}"), []string{"events[0] (line 6)", "temperatureC", "500"}},
		{"temperature a fraction", scenario("", "{at: 1s, gpu: 0, temperatureC: 97.5}"), []string{"line 6", `"97.5"`}},
		{"bad clock reason", scenario("", "{at: 1s, gpu: 0, clockEventReasons: [hwSlowdown, tooHot]}"), []string{"events[0] (line 6)", "clockEventReasons[1]", `"tooHot"`}},
		{"clock reasons not a list", scenario("", "{at: 1s, gpu: 0, clockEventReasons: hwSlowdown}"), []string{"line 6"}},
		{"negative pcie replays", scenario("", "{at: 1s, gpu: 0, pcieReplays: -1}"), []string{"events[0] (line 6)", "pcieReplays"}},
		{"nvlink without link", scenario("", "{at: 1s, gpu: 0, nvlink: {down: true}}"), []string{"events[0] (line 6)", "nvlink.link: required"}},
		{"nvlink link out of range", scenario("", "{at: 1s, gpu: 0, nvlink: {link: 18, down: true}}"), []string{"events[0] (line 6)", "nvlink.link", "18"}},
		{"nvlink with down and errors", scenario("", "{at: 1s, gpu: 0, nvlink: {link: 1, down: true, crcErrors: 3}}"), []string{"events[0] (line 6)", "nvlink"}},
		{"nvlink with neither", scenario("", "{at: 1s, gpu: 0, nvlink: {link: 1}}"), []string{"events[0] (line 6)", "nvlink"}},
		{"nvlink negative errors", scenario("", "{at: 1s, gpu: 0, nvlink: {link: 1, crcErrors: -3}}"), []string{"events[0] (line 6)", "nvlink.crcErrors"}},
		{"bad recovery action", scenario("", "{at: 1s, gpu: 0, recoveryAction: GPU_RESET}"), []string{"events[0] (line 6)", "recoveryAction", `"GPU_RESET"`}},
		{"lost false", scenario("", "{at: 1s, gpu: 0, lost: false}"), []string{"events[0] (line 6)", "lost"}},
		{"reset false", scenario("", "{at: 1s, gpu: 0, reset: false}"), []string{"events[0] (line 6)", "reset"}},
		{"reboot false", scenario("", "{at: 1s, reboot: false}"), []string{"events[0] (line 6)", "reboot"}},
		{"peer fault on a GPU of this node", scenario("", "{at: 1s, gpu: 0, peerFault: {node: n0, gpu: 2, xid: 149}}"), []string{"line 6", "gpu: a peer's fault"}},
		{"peer fault without a node", scenario("", "{at: 1s, peerFault: {gpu: 2, xid: 149}}"), []string{"line 6", "peerFault.node: required"}},
		{"peer fault of this node", scenario("", "{at: 1s, peerFault: {node: n1, gpu: 2, xid: 149}}"), []string{"line 6", "this scenario's own node"}},
		{"peer fault without a GPU", scenario("", "{at: 1s, peerFault: {node: n0, xid: 149}}"), []string{"line 6", "peerFault.gpu: required"}},
		{"peer fault of GPU 64", scenario("", "{at: 1s, peerFault: {node: n0, gpu: 64, xid: 149}}"), []string{"line 6", "peerFault.gpu"}},
		{"peer fault without an XID", scenario("", "{at: 1s, peerFault: {node: n0, gpu: 2}}"), []string{"line 6", "peerFault.xid: required"}},
		{"peer fault with an empty UUID", scenario("", "{at: 1s, peerFault: {node: n0, gpu: 2, uuid: \"\", xid: 149}}"), []string{"line 6", "peerFault.uuid"}},
		{"peer fault unknown field", scenario("", "{at: 1s, peerFault: {node: n0, gpu: 2, xid: 149, since: 1s}}"), []string{"line 6", `unknown field "since"`}},
		{"peer fault after a reset", scenario("", "{afterReset: 1s, peerFault: {node: n0, gpu: 2, xid: 149}}"), []string{"line 6", "afterReset"}},
		{"peer fault qualified", scenario("", "{at: 1s, causedByPrevious: true, peerFault: {node: n0, gpu: 2, xid: 149}}"), []string{"line 6", "only qualify"}},
		{"peer fault repeated", scenario("", "{at: 1s, repeat: 2, peerFault: {node: n0, gpu: 2, xid: 149}}"), []string{"line 6", "repeat"}},
		{"reboot of one GPU", scenario("", "{at: 1s, gpu: 0, reboot: true}"), []string{"events[0] (line 6)", "gpu"}},
		{"gpuInstance on a non-XID event", scenario("", "{at: 1s, gpu: 1, reset: true, gpuInstance: 1}"), []string{"events[0] (line 6)", "gpuInstance"}},
		{"computeInstance without gpuInstance", scenario("", "{at: 1s, gpu: 1, xid: 48, computeInstance: 1}"), []string{"events[0] (line 6)", "computeInstance"}},
		{"gpuInstance on a MIG UUID", scenario("", fmt.Sprintf("{at: 1s, gpu: %s, xid: 48, gpuInstance: 1}", sim.MIGUUID("n1", 1, 1))), []string{"events[0] (line 6)", "gpuInstance"}},
		{"negative duration", scenario("") + "duration: -1h\n", []string{"duration"}},
		{"duration without unit", scenario("") + "duration: 3600\n", []string{"line 5", `"3600"`}},
		{"duration before the last event", scenario("", "{at: 2h, gpu: 0, xid: 48}") + "duration: 1h\n", []string{"duration", "2h0m0s"}},
		{"events not a list", scenario("") + "events: {at: 1s}\n", []string{"line 5"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(tc.data))
			wantOneLineError(t, err, tc.want...)
		})
	}
}

func wantOneLineError(t *testing.T, err error, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", substrings)
	}
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\r\n") {
		t.Fatalf("error %q is not one non-empty line", msg)
	}
	for _, s := range substrings {
		if !strings.Contains(msg, s) {
			t.Fatalf("error %q does not mention %q", msg, s)
		}
	}
	if strings.Contains(msg, "sim.") || strings.Contains(msg, " into ") {
		t.Fatalf("error %q leaks Go types", msg)
	}
}

func TestLoadScenarioNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := sim.LoadScenario(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	path := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(path, []byte(scenario("", "{at: 5, gpu: 0, xid: 48}")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := sim.LoadScenario(path)
	wantOneLineError(t, err, path+": ", "line 6")
}

var uuidShape = regexp.MustCompile(`^(GPU|MIG)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestUUIDsAreStableAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, node := range []string{"sim-node", "sim-node-0", "other"} {
		for i := range sim.MaxGPUs {
			for _, u := range []string{sim.GPUUUID(node, i), sim.MIGUUID(node, i, 1), sim.MIGUUID(node, i, 7)} {
				if !uuidShape.MatchString(u) {
					t.Fatalf("UUID %q is not shaped like NVML's", u)
				}
				if seen[u] {
					t.Fatalf("UUID %q repeats", u)
				}
				seen[u] = true
			}
		}
	}
	// Pinned: other tools and tests refer to simulated GPUs by these UUIDs.
	if got := sim.GPUUUID("sim-node-0", 0); got != "GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125" {
		t.Fatalf("GPUUUID(sim-node-0, 0) = %s", got)
	}
}

func TestScenarioDevices(t *testing.T) {
	sc := mustParseScenario(t, scenario("gpus: {count: 3, model: Test, migInstances: {\"2\": 2}}\n"))
	devs := sc.Devices()
	var got []string
	for _, d := range devs {
		s := fmt.Sprintf("%d:%s", d.Index, d.UUID)
		if d.MIG != nil {
			s += fmt.Sprintf("/%s/%d/%d", d.MIG.ParentUUID, d.MIG.GPUInstance, d.MIG.ComputeInstance)
		}
		got = append(got, s)
	}
	want := []string{
		"0:" + sim.GPUUUID("n1", 0),
		"1:" + sim.GPUUUID("n1", 1),
		"2:" + sim.GPUUUID("n1", 2),
		"2:" + sim.MIGUUID("n1", 2, 1) + "/" + sim.GPUUUID("n1", 2) + "/1/0",
		"2:" + sim.MIGUUID("n1", 2, 2) + "/" + sim.GPUUUID("n1", 2) + "/2/0",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("devices\n%q\nwant\n%q", got, want)
	}
	if devs[0].Model != "Test" || devs[0].PCIBusID == "" || devs[0].PCIBusID == devs[1].PCIBusID {
		t.Fatalf("attributes %+v", devs[:2])
	}
	if _, err := health.NewTracker(health.DefaultPolicy(), devs); err != nil {
		t.Fatalf("the devices do not make a valid inventory: %v", err)
	}
}

func TestScenarioEnd(t *testing.T) {
	settle := 40 * time.Second
	cases := []struct {
		name string
		data string
		want time.Duration
	}{
		{"no events", scenario(""), settle},
		{"last event plus settling", scenario("", "{at: 1m, gpu: 0, xid: 48}", "{at: 5s, gpu: 0, xid: 48}"), time.Minute + settle},
		{"explicit duration", scenario("", "{at: 1m, gpu: 0, xid: 48}") + "duration: 1h\n", time.Hour},
		{"duration equal to the last event", scenario("", "{at: 1m, gpu: 0, xid: 48}") + "duration: 1m\n", time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := mustParseScenario(t, tc.data).End(settle); got != tc.want {
				t.Fatalf("End = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOnNodeRenamesDevicesAndKeepsEvents(t *testing.T) {
	sc, err := sim.ParseScenario([]byte(scenario("", "{at: 1s, gpu: "+sim.MIGUUID("n1", 1, 2)+", xid: 48}")))
	if err != nil {
		t.Fatal(err)
	}
	moved := sc.OnNode("n2")
	if sc.Node != "n1" {
		t.Errorf("OnNode changed the original scenario's node to %q", sc.Node)
	}
	if got := moved.Events[0]; got.GPU != 1 || got.MIG != 2 {
		t.Errorf("event on GPU %d MIG %d after OnNode, want GPU 1 MIG 2", got.GPU, got.MIG)
	}
	devs := moved.Devices()
	if got, want := devs[0].UUID, sim.GPUUUID("n2", 0); got != want {
		t.Errorf("first device UUID %q, want %q", got, want)
	}
	b := sim.New(moved, sim.Options{Virtual: true})
	if got := b.BootID(); !strings.HasPrefix(got, "n2-") {
		t.Errorf("boot ID %q, want one of node n2", got)
	}
}

// TestDriverOnlyEvents: what only a driver can answer parses for the simulated driver and is
// refused, with the line and why, by the sim backend; a bad value is refused by both.
func TestDriverOnlyEvents(t *testing.T) {
	for _, tc := range []struct {
		event string
		want  sim.Event
	}{
		{"{at: 1s, driver: unload}", sim.Event{Kind: sim.EventDriver, GPU: -1, DriverAction: sim.DriverUnload}},
		{"{at: 1s, gpu: 1, hang: 30s}", sim.Event{Kind: sim.EventHang, GPU: 1, Hang: 30 * time.Second}},
		{"{at: 1s, gpu: 1, outOfRange: temperature}", sim.Event{Kind: sim.EventOutOfRange, GPU: 1, Reading: "temperature"}},
		{"{at: 1s, gpu: 1, readsLower: ecc}", sim.Event{Kind: sim.EventReadsLower, GPU: 1, Reading: "ecc"}},
	} {
		t.Run(string(tc.want.Kind), func(t *testing.T) {
			doc := []byte(scenario("", tc.event))
			sc, err := sim.ParseDriverScenario(doc)
			if err != nil {
				t.Fatal(err)
			}
			got := sc.Events[0]
			if got.Kind != tc.want.Kind || got.GPU != tc.want.GPU || got.DriverAction != tc.want.DriverAction ||
				got.Hang != tc.want.Hang || got.Reading != tc.want.Reading {
				t.Errorf("parsed %+v, want %+v", got, tc.want)
			}
			_, err = sim.ParseScenario(doc)
			if err == nil || !strings.Contains(err.Error(), "line 6") || !strings.Contains(err.Error(), "only the simulated driver") {
				t.Errorf("the sim backend's parse = %v, want refused naming line 6 and the simulated driver", err)
			}
		})
	}
	_, err := sim.ParseDriverScenario([]byte(scenario("", "{at: 1s, gpu: 2, outOfRange: fabric}")))
	if err == nil || !strings.Contains(err.Error(), "outOfRange: must be one of") {
		t.Errorf("a bad outOfRange reading = %v", err)
	}
}
