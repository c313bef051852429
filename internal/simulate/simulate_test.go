package simulate_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/simulate"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func load(t *testing.T, path string) *sim.Scenario {
	t.Helper()
	sc, err := sim.LoadScenario(path)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func run(t *testing.T, sc *sim.Scenario, p *health.Policy) *simulate.Result {
	t.Helper()
	if p == nil {
		p = health.DefaultPolicy()
	}
	res, err := simulate.Run(context.Background(), sc, p, simulate.Options{})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// jsonOf renders the result as `gpuhealth simulate --output json` does and decodes it generically,
// so the tests check the wire shape rather than Go field names.
func jsonOf(t *testing.T, res *simulate.Result) map[string]any {
	t.Helper()
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, buf.String())
	}
	return m
}

func keys(m map[string]any) []string {
	var k []string
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

func wantKeys(t *testing.T, what string, m map[string]any, want ...string) {
	t.Helper()
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Errorf("%s has no %q key; keys %q", what, k, keys(m))
		}
	}
}

func TestJSONShape(t *testing.T) {
	m := jsonOf(t, run(t, load(t, filepath.Join("testdata", "faults.yaml")), nil))
	wantKeys(t, "the result", m, "node", "devices", "transitions")
	if m["node"] != "sim-node-0" {
		t.Fatalf("node %v", m["node"])
	}
	devices, ok := m["devices"].([]any)
	if !ok || len(devices) != 3 {
		t.Fatalf("devices %v, want a list of the 3 GPUs", m["devices"])
	}
	for i, d := range devices {
		dev := d.(map[string]any)
		wantKeys(t, fmt.Sprintf("devices[%d]", i), dev, "index", "uuid", "health", "evict", "conditions")
		if dev["index"] != float64(i) || dev["uuid"] != sim.GPUUUID("sim-node-0", i) {
			t.Errorf("devices[%d] index %v uuid %v: not listed by index", i, dev["index"], dev["uuid"])
		}
		if _, ok := dev["conditions"].([]any); !ok {
			t.Errorf("devices[%d].conditions is %v, want a list (never null)", i, dev["conditions"])
		}
		if _, ok := dev["evict"].(bool); !ok {
			t.Errorf("devices[%d].evict is %v, want a boolean", i, dev["evict"])
		}
	}

	gpu0, gpu1 := devices[0].(map[string]any), devices[1].(map[string]any)
	if gpu1["health"] != "Unhealthy" || gpu1["evict"] != true {
		t.Fatalf("GPU 1: %v", gpu1)
	}
	cond := gpu1["conditions"].([]any)[0].(map[string]any)
	wantKeys(t, "a condition", cond, "type", "severity", "reason", "message", "since", "clearsOn", "recommendedAction")
	want := map[string]any{"type": "XID", "severity": "Unhealthy", "reason": "XID79", "since": "5s",
		"clearsOn": "nodeReboot", "recommendedAction": "rebootNode"}
	for k, v := range want {
		if cond[k] != v {
			t.Errorf("condition %s = %v, want %v", k, cond[k], v)
		}
	}
	if msg, _ := cond["message"].(string); !strings.Contains(msg, "79") {
		t.Errorf("message %q does not name the XID", msg)
	}
	if gpu0["health"] != "Degraded" || gpu0["conditions"].([]any)[0].(map[string]any)["since"] != "7s" {
		t.Errorf("GPU 0: %v", gpu0)
	}
	// Application XIDs are counted and visible.
	xids, _ := gpu0["xids"].([]any)
	if len(xids) != 1 || xids[0].(map[string]any)["xid"] != float64(13) || xids[0].(map[string]any)["count"] != float64(3) {
		t.Errorf("GPU 0 xids %v", gpu0["xids"])
	}

	transitions, ok := m["transitions"].([]any)
	if !ok {
		t.Fatalf("transitions %v", m["transitions"])
	}
	var got []string
	for i, tr := range transitions {
		tm := tr.(map[string]any)
		wantKeys(t, fmt.Sprintf("transitions[%d]", i), tm, "at", "index", "uuid", "from", "to", "reason")
		got = append(got, fmt.Sprintf("%v %v %v %v->%v %v", tm["at"], tm["index"], tm["uuid"], tm["from"], tm["to"], tm["reason"]))
	}
	wantT := []string{
		fmt.Sprintf("5s 1 %s Healthy->Unhealthy XID79", sim.GPUUUID("sim-node-0", 1)),
		fmt.Sprintf("7s 0 %s Healthy->Degraded TemperatureAtSlowdown", sim.GPUUUID("sim-node-0", 0)),
		fmt.Sprintf("1m0s 2 %s Healthy->Unhealthy XID62", sim.MIGUUID("sim-node-0", 2, 2)),
	}
	if !slices.Equal(got, wantT) {
		t.Fatalf("transitions\n%q\nwant\n%q", got, wantT)
	}
	if p := transitions[2].(map[string]any)["parentUUID"]; p != sim.GPUUUID("sim-node-0", 2) {
		t.Errorf("MIG transition parentUUID %v", p)
	}
	// MIG instances are listed under their GPU.
	migs, _ := devices[2].(map[string]any)["migDevices"].([]any)
	if len(migs) != 2 || migs[1].(map[string]any)["health"] != "Unhealthy" || migs[0].(map[string]any)["health"] != "Healthy" {
		t.Fatalf("MIG devices %v", migs)
	}
	if m["end"] != "2m0s" {
		t.Errorf("end %v", m["end"])
	}
}

func TestQuietNodeHasEmptyListsNotNulls(t *testing.T) {
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := run(t, sc, nil).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Contains(out, "null") || !strings.Contains(out, `"transitions": []`) || !strings.Contains(out, `"conditions": []`) {
		t.Fatalf("output:\n%s", out)
	}
	if !strings.Contains(out, `"node": "sim-node"`) {
		t.Fatalf("default node name missing:\n%s", out)
	}
}

// exampleTransitions is what the bundled one-hour example must produce under the default profile.
var exampleTransitions = []string{
	"30s 3 Healthy->Unhealthy XID79",
	"2m0s 2 Healthy->Unhealthy XID48",
	"5m0s 5 Healthy->Unhealthy TemperatureAtShutdown",
	"6m20s 5 Unhealthy->Degraded Recovered",
	"8m20s 5 Degraded->Healthy Recovered",
	"10m0s 4 Healthy->Degraded SingleBitECCStorm",
	"12m0s 6 Healthy->Degraded ClocksThrottled",
	"14m20s 6 Degraded->Healthy Recovered",
	"16m0s 0 Healthy->Unhealthy XID109",
	"20m0s 7 Healthy->Unhealthy XID62",
	"20m0s 4 Degraded->Healthy QuietPeriodElapsed",
	"30m0s 0 Unhealthy->Healthy GPUReset",
	"30m0s 2 Unhealthy->Healthy GPUReset",
	"40m0s 7 Unhealthy->Healthy GPUReset",
	"45m0s 1 Healthy->Unhealthy RecoveryActionGPUReset",
	"50m0s 1 Unhealthy->Healthy GPUReset",
	"55m0s 3 Unhealthy->Healthy NodeReboot",
}

func transitionLines(res *simulate.Result) []string {
	var out []string
	for _, tr := range res.Transitions {
		out = append(out, fmt.Sprintf("%s %d %s->%s %s", time.Duration(tr.At), tr.Index, tr.From, tr.To, tr.Reason))
	}
	return out
}

func TestTheOneHourExample(t *testing.T) {
	sc := load(t, filepath.Join("..", "..", "examples", "scenario.yaml"))
	res := run(t, sc, nil)
	if got := transitionLines(res); !slices.Equal(got, exampleTransitions) {
		t.Fatalf("transitions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(exampleTransitions, "\n"))
	}
	for _, d := range res.Devices {
		if d.Health != "Healthy" || len(d.Conditions) != 0 {
			t.Errorf("GPU %d ends %s: %+v", d.Index, d.Health, d.Conditions)
		}
	}
	if time.Duration(res.End) != time.Hour || res.BootID != "sim-node-0-boot-1" {
		t.Fatalf("end %v boot %q", time.Duration(res.End), res.BootID)
	}
	// The storm of 10,000 XIDs 31 and 10,000 XIDs 109 is counted, and made one transition.
	var counts []string
	for _, x := range res.Devices[0].XIDs {
		counts = append(counts, fmt.Sprintf("%d:%d", x.XID, x.Count))
	}
	if !slices.Equal(counts, []string{"31:10000", "109:10000"}) {
		t.Fatalf("GPU 0 XIDs %q", counts)
	}
	// GPU 6's kernel-log XID 13 is counted; the spoofed XID 79 line is not.
	if x := res.Devices[6].XIDs; len(x) != 1 || x[0].XID != 13 || x[0].Count != 1 {
		t.Fatalf("GPU 6 XIDs %+v, want XID 13 once", x)
	}
}

func TestTheExampleUnderTheDevicePluginProfile(t *testing.T) {
	sc := load(t, filepath.Join("..", "..", "examples", "scenario.yaml"))
	res := run(t, sc, health.DevicePluginPolicy())
	var got []string
	for _, d := range res.Devices {
		got = append(got, fmt.Sprintf("%d:%s", d.Index, d.Health))
	}
	// 79 (GPU 3), 48 (GPU 2) and 62 (in GPU 7's MIG instance) stick: neither a reset nor the
	// reboot clears them; 13, 31, 109 are ignored; no polled check runs.
	want := []string{"0:Healthy", "1:Healthy", "2:Unhealthy", "3:Unhealthy", "4:Healthy", "5:Healthy", "6:Healthy", "7:Healthy"}
	if !slices.Equal(got, want) {
		t.Fatalf("final health %q, want %q", got, want)
	}
	if h := res.Devices[7].MIGDevices[1].Health; h != "Unhealthy" {
		t.Fatalf("GPU 7 MIG instance 2: %s", h)
	}
	if len(res.Transitions) != 3 {
		t.Fatalf("transitions %q, want the three faults only", transitionLines(res))
	}
}

func TestConfigChangesTheOutcome(t *testing.T) {
	sc := load(t, filepath.Join("testdata", "faults.yaml"))
	cfg, err := config.Parse([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nchecks: {thermal: {slowdownC: 95, shutdownC: 100}}\nxids: {overrides: [{xids: [79], evict: false, clearsOn: gpuReset}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Policy()
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, sc, p)
	if res.Devices[0].Health != "Healthy" {
		t.Errorf("92°C under a 95°C slowdown: %s", res.Devices[0].Health)
	}
	if d := res.Devices[1]; d.Health != "Unhealthy" || d.Evict || d.Conditions[0].ClearsOn != "gpuReset" {
		t.Errorf("XID 79 with the override: %+v", d)
	}
}

func TestSampleIntervalAndSettling(t *testing.T) {
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 1}\nevents:\n  - {at: 0s, gpu: 0, temperatureC: 97}\n  - {at: 1s, gpu: 0, temperatureC: 40}\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := health.DefaultPolicy()
	p.Thermal.RecoverySamples = 5
	res, err := simulate.Run(context.Background(), sc, p, simulate.Options{SampleInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Without a duration the replay runs long enough for the hysteresis window to close.
	if got := transitionLines(res); !slices.Equal(got, []string{"0s 0 Healthy->Unhealthy TemperatureAtShutdown", "5s 0 Unhealthy->Healthy Recovered"}) {
		t.Fatalf("transitions %q", got)
	}
	if res.Signals == 0 {
		t.Fatal("no signals counted")
	}
}

func TestQuietPeriodsEndByTheEnd(t *testing.T) {
	// The last signal of a quiet-period condition is near the end: Run's final Tick still
	// expires what has run out by then, and nothing that has not.
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\nevents:\n  - {at: 0s, gpu: 0, xid: 92}\n  - {at: 5m, gpu: 1, xid: 92}\nduration: 12m\n"))
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, sc, nil)
	if res.Devices[0].Health != "Healthy" || res.Devices[1].Health != "Degraded" {
		t.Fatalf("final health %s, %s; want Healthy, Degraded", res.Devices[0].Health, res.Devices[1].Health)
	}
}

func TestTableOutput(t *testing.T) {
	res := run(t, load(t, filepath.Join("testdata", "faults.yaml")), nil)
	var buf bytes.Buffer
	if err := res.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"NODE sim-node-0", "INDEX", "HEALTH", "TRANSITIONS (3)",
		sim.GPUUUID("sim-node-0", 1), "XID79(Unhealthy, since 5s, until nodeReboot)",
		"2/gi2/ci0", sim.MIGUUID("sim-node-0", 2, 2),
		"TemperatureAtSlowdown",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table does not contain %q:\n%s", want, out)
		}
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := simulate.Run(ctx, load(t, filepath.Join("..", "..", "examples", "scenario.yaml")), health.DefaultPolicy(), simulate.Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
}

func TestALongStormReplays(t *testing.T) {
	// One million identical XIDs: one transition, one counter. No timing is asserted.
	sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 1}\nevents:\n  - {at: 1s, gpu: 0, xid: 48, repeat: 1000000}\nduration: 1h\n"))
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, sc, nil)
	if len(res.Transitions) != 1 || res.Devices[0].XIDs[0].Count != 1_000_000 {
		t.Fatalf("transitions %q, xids %+v", transitionLines(res), res.Devices[0].XIDs)
	}
}

func TestCounterRatesAreMeasuredOverWholeRounds(t *testing.T) {
	// NVML offers PCIe replay and NVLink error counters only to polling, so a rate is the
	// increase over a sampling round, wherever in the round the increase fell. With the default
	// 10s rounds and 60/min limits, 5 is under the limit (30/min) and 20 is over it (120/min).
	cases := []struct {
		name  string
		event string
		want  string
	}{
		{"few replays just after a round", "{at: 10500ms, gpu: 0, pcieReplays: 5}", "Healthy"},
		{"few replays just before a round", "{at: 19500ms, gpu: 0, pcieReplays: 5}", "Healthy"},
		{"many replays just after a round", "{at: 10500ms, gpu: 0, pcieReplays: 20}", "Degraded"},
		{"few NVLink errors just after a round", "{at: 10500ms, gpu: 0, nvlink: {link: 1, crcErrors: 5}}", "Healthy"},
		{"many NVLink errors just before a round", "{at: 19500ms, gpu: 0, nvlink: {link: 1, crcErrors: 20}}", "Degraded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sc, err := sim.ParseScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 1}\nduration: 20s\nevents:\n  - " + tc.event + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, sc, nil).Devices[0].Health; got != tc.want {
				t.Fatalf("health %s, want %s", got, tc.want)
			}
		})
	}
}

func TestTheHealthOverTimeExample(t *testing.T) {
	sc := load(t, filepath.Join("..", "..", "examples", "health-over-time.yaml"))
	res := run(t, sc, nil)
	want := []string{
		"0s -1 Healthy->Unhealthy GPUMissing",
		"20m0s 0 Healthy->Degraded RepeatedXID13OnSameGPU",
		"30m0s 0 Degraded->Healthy QuietPeriodElapsed",
		"35m0s 1 Healthy->Unhealthy XID149",
		"35m0s 2 Healthy->Degraded XID145CausedByGPU1",
		"36m0s 3 Healthy->Degraded XID144",
	}
	got := transitionLines(res)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(res.Findings) != 2 || res.Findings[0].Reason != health.ReasonBelowCapacity ||
		res.Findings[0].Message != "the node runs 4 of its 5 GPUs: MISSING-0000:14:00.0 missing" ||
		res.Findings[1].Reason != health.ReasonXIDSpreadOverGPU || len(res.Findings[1].GPUs) != 3 ||
		time.Duration(res.Findings[1].Since) != 32*time.Minute {
		t.Fatalf("findings %+v, want GPUsMissing, then XIDSpreadOverGPUs on 3 GPUs since 32m", res.Findings)
	}
	// The missing GPU (gpus.missing) is a placeholder, and the kernel log's line naming its
	// address is kept against it.
	m := res.Devices[0]
	if !m.Missing || m.UUID != "MISSING-0000:14:00.0" || m.Health != "Unhealthy" || len(m.Conditions) != 2 ||
		m.Conditions[0].Reason != health.ReasonGPUMissing || m.Conditions[1].Reason != "GPULost" {
		t.Errorf("missing GPU %+v, want GPUMissing and the kernel log's GPULost", m)
	}
	// The same scenario under the device plugin's profile has no repeat rules: only the missing
	// GPU's finding.
	res = run(t, sc, health.DevicePluginPolicy())
	if len(res.Findings) != 1 || res.Findings[0].Reason != health.ReasonBelowCapacity {
		t.Errorf("device-plugin profile: findings %+v, want only GPUsMissing", res.Findings)
	}
}

// The early warnings example: one condition per GPU, each where examples/early-warnings.yaml
// says, and the fabric registration still pending after ten minutes.
func TestTheEarlyWarningsExample(t *testing.T) {
	sc := load(t, filepath.Join("..", "..", "examples", "early-warnings.yaml"))
	res := run(t, sc, nil)
	want := []string{
		"0 Unhealthy FabricRegistrationFailed 30s",
		"1 Degraded FabricRegistrationPending 10m0s",
		"2 Degraded FabricBandwidthDegraded 30s",
		"3 Degraded RowRemapAvailabilityLow 1m0s",
		"4 Degraded RowRemapAvailabilityNone 1m0s",
		"5 Degraded SRAMECCThresholdExceeded 2m0s",
		"6 Degraded PCIeLinkDegraded 2m0s",
		"7 Degraded NVLinkRecoveriesRising 8m0s",
	}
	var got []string
	for _, d := range res.Devices {
		for _, c := range d.Conditions {
			got = append(got, fmt.Sprintf("%d %s %s %s", d.Index, d.Health, c.Reason, time.Duration(c.Since)))
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("conditions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(res.Transitions) != len(want) {
		t.Errorf("transitions %q, want one per GPU", transitionLines(res))
	}
}

// The NVLink-domain example: caused-by XIDs attributed to a peer node's fault, before and after
// its report, withdrawn when it ends, and not made once it has ended.
func TestTheNVLinkDomainExample(t *testing.T) {
	sc := load(t, filepath.Join("..", "..", "examples", "nvlink-domain.yaml"))
	res := run(t, sc, nil)
	want := []string{
		"5s 0 Healthy->Unhealthy XID145",
		"6s 0 Unhealthy->Degraded " + health.ReasonAttributedToPeer,
		"10s 1 Healthy->Degraded XID145CausedByPeerGPU",
		"11s 3 Healthy->Unhealthy XID145",
		"2m0s 0 Degraded->Unhealthy XID145",
		"2m0s 1 Degraded->Unhealthy XID145",
		"12m0s 2 Healthy->Unhealthy XID145",
	}
	got := transitionLines(res)
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// While the peer reports its fault, GPU 0's message names the peer's GPU and node.
	mid := *sc
	mid.Duration = time.Minute
	if c := run(t, &mid, nil).Devices[0].Conditions[0]; !strings.Contains(c.Message, "caused by XID 149 on GPU 2 (GPU-") || !strings.HasSuffix(c.Message, " of node nvl72-a-0") {
		t.Errorf("GPU 0's message %q does not name the peer's GPU and node", c.Message)
	}
}
