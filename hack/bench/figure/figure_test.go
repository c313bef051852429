package figure

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestWriteRead(t *testing.T) {
	want := []Figure{
		{Name: SignalToObject, Labels: map[string]string{LabelPath: "fault -> DeviceTaintRule ADDED"}, Unit: UnitMilliseconds,
			Value: 6.5, Samples: 100, Percentiles: map[string]float64{P50: 6.5, P99: 19.9, Max: 31}},
		{Name: FleetWaveRequests, Unit: UnitRequests, Value: 1600, By: map[string]float64{"PATCH nodes": 800, "POST events": 800}},
		{Part: "fleet", Run: "2", Name: FleetSteadyCPU, Unit: UnitCPU, Value: 0}, // a measured zero stays a zero
	}
	var b strings.Builder
	if err := Write(&b, want...); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(b.String(), "\n"); n != len(want) {
		t.Fatalf("%d lines for %d figures:\n%s", n, len(want), b.String())
	}
	if !strings.Contains(b.String(), `"fault -> DeviceTaintRule ADDED"`) {
		t.Errorf("labels are escaped, want them readable:\n%s", b.String())
	}
	got, err := Read(strings.NewReader("\n" + b.String() + "\n\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
}

func TestReadRejects(t *testing.T) {
	const good = `{"name":"nodes","unit":"nodes","value":500}`
	for _, tc := range []struct {
		name, line, wantErr string
	}{
		{"malformed JSON", `{"name":"nodes","unit":"nodes","value":5`, "line 2: unexpected end of JSON input"},
		{"not an object", `[1, 2]`, "line 2: json: cannot unmarshal array"},
		{"no value", `{"name":"nodes","unit":"nodes"}`, "line 2: figure nodes without a value"},
		{"null value", `{"name":"nodes","unit":"nodes","value":null}`, "line 2: figure nodes without a value"},
		{"value as a string", `{"name":"nodes","unit":"nodes","value":"500"}`, "line 2: json: cannot unmarshal string"},
		{"no name", `{"unit":"nodes","value":500}`, "line 2: figure without a name"},
		{"no unit", `{"name":"nodes","value":500}`, "line 2: figure nodes without a unit"},
		{"unknown field", `{"name":"nodes","unit":"nodes","value":500,"vaule":1}`, `line 2: json: unknown field "vaule"`},
		{"two objects on a line", good + good, "line 2: invalid character '{' after top-level value"},
		{"markdown", `| path | p50 | p99 | max |`, "line 2: invalid character '|'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			figs, err := Read(strings.NewReader(good + "\n" + tc.line + "\n" + good + "\n"))
			if err == nil {
				t.Fatalf("no error; read %+v", figs)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q, want it to contain %q", err, tc.wantErr)
			}
			if figs != nil {
				t.Errorf("figures %+v next to the error, want none", figs)
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "figures.jsonl")
	if err := WriteFile(path, Figure{Name: FleetNodes, Unit: UnitNodes, Value: 500}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil || len(got) != 1 || got[0].Value != 500 {
		t.Errorf("ReadFile = %+v, %v; want the one figure", got, err)
	}

	empty := filepath.Join(dir, "empty.jsonl")
	if err := os.WriteFile(empty, []byte("\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(empty); err == nil || !strings.Contains(err.Error(), "empty.jsonl: no figures") {
		t.Errorf("an empty file: error %v, want no figures", err)
	}

	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"name":"nodes","unit":"nodes"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(bad); err == nil || !strings.Contains(err.Error(), "bad.jsonl: line 1: figure nodes without a value") {
		t.Errorf("a figure without a value: error %v, want the file, the line and the figure", err)
	}

	if _, err := ReadFile(filepath.Join(dir, "missing.jsonl")); err == nil {
		t.Error("a missing file: no error")
	}
}

func TestPercentile(t *testing.T) {
	f := Figure{Part: "latency", Run: "1", Name: SignalToObject, Labels: map[string]string{LabelPath: "p"}, Unit: UnitMilliseconds,
		Percentiles: map[string]float64{P50: 8.3}}
	if v, err := f.Percentile(P50); err != nil || v != 8.3 {
		t.Errorf("Percentile(p50) = %v, %v", v, err)
	}
	_, err := f.Percentile(P99)
	if err == nil || err.Error() != `figure latency run 1: signal_to_object{"path":"p"} has no p99` {
		t.Errorf("Percentile(p99) error %v", err)
	}
}

func TestWriteRejectsNaN(t *testing.T) {
	var b strings.Builder
	if err := Write(&b, Figure{Name: "x", Unit: "s", Value: math.NaN()}); err == nil {
		t.Error("NaN written without an error")
	}
}
