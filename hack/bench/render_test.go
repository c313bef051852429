package main

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// testdata/results.json holds figures that reproduce the docs/benchmarks.md of 2026-11-30 (with
// several runs around each median) plus one run of the agent container part and three of the
// simulated driver's benchmarks (2026-12-01) and five of BenchmarkExtenderFilterWithSlowClients
// (2026-12-02), and the larger fleet run's heartbeat phase (made up for its 2,000 nodes from the
// ratio a 200-node run of TestFleet measured on 2026-12-02: no bench run has measured it yet), and
// testdata/benchmarks.golden.md that document: the
// renderer keeps the page's shape. After changing the page's text on purpose, write the new
// golden with `go run ./hack/bench -render hack/bench/testdata/results.json -out
// hack/bench/testdata/benchmarks.golden.md`.
func TestRenderGolden(t *testing.T) {
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	_, doc, err := render(res)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("testdata/benchmarks.golden.md")
	if err != nil {
		t.Fatal(err)
	}
	if doc != string(want) {
		got, wantLines := strings.Split(doc, "\n"), strings.Split(string(want), "\n")
		for i := range min(len(got), len(wantLines)) {
			if got[i] != wantLines[i] {
				t.Fatalf("line %d differs:\n got: %s\nwant: %s", i+1, got[i], wantLines[i])
			}
		}
		t.Fatalf("%d lines, want %d", len(got), len(wantLines))
	}
}

func TestRenderParts(t *testing.T) {
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		parts     []string
		wantRows  []string // each row's first cell starts with one of these, in order
		fleetRuns int      // rows of the fleet's per-run table
	}{
		{"library only", []string{partLibrary}, []string{"library", "library", "library", "kernel log: parse", "kernel log: start-up replay", "extender", "extender",
			"extender: /filter over loopback while 8 slow clients", "simulated driver: one library call", "simulated driver: 64 GPUs"}, 0},
		{"latency only", []string{partLatency}, []string{"signal → object: fault -> volcano", "signal → object: fault -> DeviceTaintRule",
			"signal → object: recovery -> annotation", "signal → object: recovery -> DeviceTaintRule", "API writes"}, 0},
		{"agent and the breaker run", []string{partAgent, partFleetBreaker}, []string{"agent: idle", "agent: XID storm, 8 simulated GPUs, 99,973 XIDs/s",
			"fleet: 500 nodes, circuit breaker on"}, 1},
		{"agent container only", []string{partContainer}, []string{"agent in a container: idle", "agent in a container: XID storm"}, 0},
		{"nothing", nil, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := res
			r.Figures = slices.DeleteFunc(slices.Clone(res.Figures), func(f figure.Figure) bool { return !slices.Contains(tc.parts, f.Part) })
			table, doc, err := render(r)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(table), "\n")[2:]
			if len(lines) != len(tc.wantRows) {
				t.Fatalf("%d rows, want %d:\n%s", len(lines), len(tc.wantRows), table)
			}
			for i, l := range lines {
				if !strings.HasPrefix(l, "| "+tc.wantRows[i]) {
					t.Errorf("row %d %q, want it to start with %q", i+1, l, tc.wantRows[i])
				}
			}
			if got := strings.Count(doc, "\n| 1 "); got != min(tc.fleetRuns, 1) {
				t.Errorf("fleet runs table: %d first rows, want %d", got, min(tc.fleetRuns, 1))
			}
			if tc.fleetRuns > 0 && !strings.Contains(doc, "| 1 (breaker) | 500 | 7.6 s, 4000 requests |") {
				t.Errorf("the breaker run is run 1 when it is the only one:\n%s", doc)
			}
		})
	}
}

// A figure the document needs and the results lack is an error that names it, never a zero.
func TestRenderMissing(t *testing.T) {
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	without := func(drop func(figure.Figure) bool) results {
		r := res
		r.Figures = slices.DeleteFunc(slices.Clone(res.Figures), drop)
		return r
	}
	for _, tc := range []struct {
		name    string
		res     results
		wantErr string
	}{
		{"a benchmark's unit", without(func(f figure.Figure) bool { return f.Name == benchFilter && f.Unit == "p99-ms" }),
			"no figure BenchmarkExtenderFilter in p99-ms (part library)"},
		{"a unit of the slow clients' benchmark", without(func(f figure.Figure) bool { return f.Name == benchFilterSlowClients && f.Unit == "p99-ratio" }),
			"no figure BenchmarkExtenderFilterWithSlowClients in p99-ratio (part library)"},
		{"a scenario of the agent", without(func(f figure.Figure) bool { return f.Part == partAgent && f.Labels[labelScenario] == scenarioStorm }),
			"no figure xid_rate{scenario=storm} in XIDs/s (part agent)"},
		{"the kubelet's view of the idle container", without(func(f figure.Figure) bool {
			return f.Part == partContainer && f.Name == figure.ContainerWorkingSet && f.Labels[figure.LabelScenario] == figure.ScenarioIdle
		}), "no figure container_working_set{scenario=idle} in KiB (part container)"},
		{"a percentile", results{Settings: res.Settings, Figures: []figure.Figure{
			{Part: partLatency, Run: "1", Name: figure.SignalToObject, Labels: map[string]string{figure.LabelPath: "p"}, Unit: figure.UnitMilliseconds, Value: 8,
				Percentiles: map[string]float64{figure.P50: 8}},
			{Part: partLatency, Run: "1", Name: figure.WritesPerChange, Labels: map[string]string{figure.LabelSink: "annotation"}, Unit: figure.UnitWritesPerChange, Value: 1},
		}}, `figure latency run 1: signal_to_object{"path":"p"} has no p99`},
		{"a path label", results{Figures: []figure.Figure{
			{Part: partLatency, Run: "1", Name: figure.SignalToObject, Unit: figure.UnitMilliseconds, Value: 8},
		}}, "figure latency run 1: signal_to_object has no label path"},
		{"a figure of the heartbeat phase", without(func(f figure.Figure) bool {
			return f.Part == partFleetLarge && f.Name == figure.FleetHeartbeatRequests
		}), "no figure heartbeat_requests in requests (part fleet-large)"},
		{"a fleet figure only the runs table shows", without(func(f figure.Figure) bool {
			return f.Part == partFleetLarge && f.Name == figure.FleetSteadyRequests
		}), "no figure steady_requests in requests (part fleet-large)"},
		{"the fleet's figures in another unit", results{Figures: slices.Collect(func(yield func(figure.Figure) bool) {
			for _, f := range res.Figures {
				if f.Part == partFleetLarge && f.Name == figure.FleetStartupTime {
					f.Unit = figure.UnitMilliseconds
				}
				if f.Part == partFleetLarge && !yield(f) {
					return
				}
			}
		})}, "no figure startup_time in s (part fleet-large)"},
		{"a figure twice", results{Figures: append(slices.Clone(res.Figures), res.Figures[0])},
			"figure library run 1: BenchmarkXIDStorm/xid=13 in ns/op twice"},
		{"a figure without a run", results{Figures: []figure.Figure{{Part: partLibrary, Name: benchMixedLoad, Unit: "ns/op", Value: 1}}},
			"figure library run : BenchmarkMixedLoad: no part or run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table, doc, err := render(tc.res)
			if err == nil {
				t.Fatalf("no error; rendered\n%s", table)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q, want it to contain %q", err, tc.wantErr)
			}
			if table != "" || doc != "" {
				t.Error("rendered something next to the error")
			}
		})
	}
}

// Results from before BenchmarkExtenderFilterWithSlowClients existed render without its row.
func TestRenderWithoutTheSlowClients(t *testing.T) {
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	with, _, err := render(res)
	if err != nil {
		t.Fatal(err)
	}
	res.Figures = slices.DeleteFunc(slices.Clone(res.Figures), func(f figure.Figure) bool { return f.Name == benchFilterSlowClients })
	table, _, err := render(res)
	if err != nil {
		t.Fatal(err)
	}
	const row = "| extender: /filter over loopback while 8 slow clients"
	if !strings.Contains(with, row) || strings.Contains(table, row) {
		t.Errorf("the slow clients' row: with its figures %v, without them %v; want it only with them",
			strings.Contains(with, row), strings.Contains(table, row))
	}
	if got, want := strings.Count(table, "\n"), strings.Count(with, "\n")-1; got != want {
		t.Errorf("%d lines without the slow clients, want %d:\n%s", got, want, table)
	}
}

// Results from before the fleet's heartbeat phase, or from runs without it, render without its
// row; a part whose runs had it gets the row, with the medians of its runs.
func TestRenderHeartbeat(t *testing.T) {
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	isBeat := func(f figure.Figure) bool { return strings.HasPrefix(f.Name, "heartbeat_") }
	// The fleet part's three runs get the larger run's heartbeat figures, scaled to 500 nodes
	// and a little different in each run.
	var fleetBeats []figure.Figure
	for i, run := range []string{"1", "2", "3"} {
		for _, f := range res.Figures {
			if f.Part != partFleetLarge || !isBeat(f) {
				continue
			}
			f.Part, f.Run, f.By = partFleet, run, maps.Clone(f.By)
			scale := 0.25 * (1 + 0.01*float64(i))
			switch f.Unit {
			case figure.UnitWrites, figure.UnitRequests:
				f.Value *= scale
				for k := range f.By {
					f.By[k] *= scale
				}
			case figure.UnitWritesPerNodePerPeriod:
				f.Value = 0.9 + 0.01*float64(i)
			}
			fleetBeats = append(fleetBeats, f)
		}
	}

	for _, tc := range []struct {
		name    string
		figures []figure.Figure
		want    []string // rows that start with these
		notWant []string
	}{
		{"only the larger run", res.Figures, []string{"| fleet: heartbeat, 2000 nodes (agent.heartbeat 20 s, 60 s of steady state) | 0.93 writes per node per period " +
			"(goal ≤ 1 write per node per period: 0.93×); 5610 writes (condition 5610), 5610 requests (PATCH nodes/status 5610); " +
			"at the default 5 min, 6.2 writes/s for the whole fleet | test/fleet, one run;"}, []string{"| fleet: heartbeat, 500 nodes"}},
		{"before the heartbeat", slices.DeleteFunc(slices.Clone(res.Figures), isBeat), nil, []string{"| fleet: heartbeat"}},
		{"the fleet's runs too", append(slices.Clone(res.Figures), fleetBeats...), []string{"| fleet: heartbeat, 500 nodes (agent.heartbeat 20 s, 60 s of steady state) | " +
			"0.91 writes per node per period (goal ≤ 1 write per node per period: 0.91×); 1417 writes (condition 1417), 1417 requests (PATCH nodes/status 1417); " +
			"at the default 5 min, 1.5 writes/s for the whole fleet | test/fleet, one process, own client per node, median of 3;",
			"| fleet: heartbeat, 2000 nodes"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := res
			r.Figures = tc.figures
			table, _, err := render(r)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(table, "\n"+w) {
					t.Errorf("no row %q in\n%s", w, table)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(table, "\n"+w) {
					t.Errorf("a row %q in\n%s", w, table)
				}
			}
		})
	}
}

func TestLoadResults(t *testing.T) {
	dir := t.TempDir()
	res, err := loadResults("testdata/results.json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "results.json")
	if err := saveResults(path, res); err != nil {
		t.Fatal(err)
	}
	again, err := loadResults(path)
	if err != nil {
		t.Fatal(err)
	}
	_, want, _ := render(res)
	if _, got, err := render(again); err != nil || got != want {
		t.Errorf("saved and loaded results render differently (%v)", err)
	}

	for _, tc := range []struct {
		name, text, wantErr string
	}{
		{"malformed", `{"took": "1s", "figures": [`, "unexpected EOF"},
		{"an unknown field", `{"tooks": "1s"}`, `unknown field "tooks"`},
		{"a figure without a value", `{"figures": [{"part": "library", "run": "1", "name": "BenchmarkX", "unit": "ns/op"}]}`,
			"figure BenchmarkX without a value"},
		{"an unknown field in a figure", `{"figures": [{"part": "library", "run": "1", "name": "BenchmarkX", "unit": "ns/op", "value": 1, "runs": 5}]}`,
			`unknown field "runs"`},
		{"a bad duration", `{"took": "eleven minutes"}`, `invalid duration "eleven minutes"`},
		{"two documents", `{} {}`, "more than one JSON value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			if err := os.WriteFile(p, []byte(tc.text), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := loadResults(p)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), p) {
				t.Errorf("error %v, want the file and %q", err, tc.wantErr)
			}
		})
	}
}

func TestReadRun(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "latency-1.jsonl")
	text := `{"name":"signal_to_object","labels":{"path":"p"},"unit":"ms","value":8.3,"percentiles":{"p50":8.3,"p99":17.8}}` + "\n" +
		`{"name":"api_writes_per_change","labels":{"sink":"annotation"},"unit":"writes/change","value":1,"samples":200}` + "\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	figs, err := readRun(path, partLatency, "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range figs {
		if f.Part != partLatency || f.Run != "2" {
			t.Errorf("figure %s not tagged with part latency, run 2", f.ID())
		}
	}

	// A test writes its own figures; where they come from is hack/bench's to say.
	if err := os.WriteFile(path, []byte(`{"part":"fleet","name":"nodes","unit":"nodes","value":5}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readRun(path, partLatency, "1"); err == nil || !strings.Contains(err.Error(), "part and run are hack/bench's to set") {
		t.Errorf("a figure with a part: error %v", err)
	}

	// A test that broke off half-way through a line.
	if err := os.WriteFile(path, []byte(text+`{"name":"api_writes_per_change","labels":{"si`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readRun(path, partLatency, "1"); err == nil || !strings.Contains(err.Error(), "latency-1.jsonl: line 3: unexpected end of JSON input") {
		t.Errorf("a truncated line: error %v, want the file and the line", err)
	}
}

// Runs that measured the bare client and the trace show the ratio, the runs' spread of it, and
// the stages beside the agent's figure.
func TestRenderLatencyAgainstTheBareClient(t *testing.T) {
	const path = "fault -> volcano.sh/gpu-unhealthy-ids"
	ms := func(run, name string, p50, p99 float64, labels ...string) figure.Figure {
		f := figure.Figure{Part: partLatency, Run: run, Name: name, Labels: map[string]string{figure.LabelPath: path}, Unit: figure.UnitMilliseconds,
			Value: p50, Samples: 100, Percentiles: map[string]float64{figure.P50: p50, figure.P99: p99, figure.Max: p99}}
		for i := 0; i+1 < len(labels); i += 2 {
			f.Labels[labels[i]] = labels[i+1]
		}
		return f
	}
	res := results{Figures: []figure.Figure{
		ms("1", figure.SignalToObject, 7, 12),
		ms("1", figure.BareClientToObject, 5, 10),
		ms("1", figure.SignalTrace, 0.3, 1, figure.LabelStage, "signal -> request sent"),
		ms("1", figure.SignalTrace, 6.5, 11, figure.LabelStage, "request -> response"),
		{Part: partLatency, Run: "1", Name: figure.WritesPerChange, Labels: map[string]string{figure.LabelSink: "annotation"}, Unit: figure.UnitWritesPerChange, Value: 1},
		ms("2", figure.SignalToObject, 6, 13),
		ms("2", figure.BareClientToObject, 5, 10),
		ms("2", figure.SignalTrace, 0.3, 1, figure.LabelStage, "signal -> request sent"),
		ms("2", figure.SignalTrace, 5.5, 12, figure.LabelStage, "request -> response"),
		{Part: partLatency, Run: "2", Name: figure.WritesPerChange, Labels: map[string]string{figure.LabelSink: "annotation"}, Unit: figure.UnitWritesPerChange, Value: 1},
	}}
	table, _, err := render(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| signal → object: " + path + " | p50 6.5 ms, p99 12.5 ms; bare client p50 5.0 ms, p99 10.0 ms; ratio 1.30× / 1.25× (the runs' ratios p50 1.20–1.40, p99 1.20–1.30) |",
		"| trace, p50 of each stage: " + path + " | signal -> request sent 0.30 ms, request -> response 6.00 ms |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
