package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// The parts figures belong to (figure.Figure.Part). The fleet's larger run and its run with the
// circuit breaker are parts of their own: they are not among the runs the medians are taken over.
const (
	partLibrary      = "library"
	partAgent        = "agent"
	partContainer    = "container"
	partLatency      = "latency"
	partFleet        = "fleet"
	partFleetLarge   = "fleet-large"
	partFleetBreaker = "fleet-breaker"
	// partScale is `make bench-fleet-50k` (run_scale.go): not in `make bench`.
	partScale = "fleet-50k"
)

// results is everything one bench run measured, and all that the document is rendered from;
// results.json in the raw directory holds it.
type results struct {
	Machine  machineInfo     `json:"machine"`
	Settings settings        `json:"settings"`
	Took     duration        `json:"took"`
	Figures  []figure.Figure `json:"figures"`
}

// settings are the knobs a bench run used; the document quotes them.
type settings struct {
	Runs         int      `json:"runs"`
	AgentWindow  duration `json:"agentWindow"`
	StormRate    int      `json:"stormRate"`
	Faults       int      `json:"faults"`
	FleetNodes   int      `json:"fleetNodes"`
	FleetRuns    int      `json:"fleetRuns"`
	FleetSteady  duration `json:"fleetSteady"`
	FleetLarge   int      `json:"fleetLarge"`
	FleetBreaker bool     `json:"fleetBreaker"`
	// The fleet at scale (run_scale.go; 0 nodes: not run).
	Scale          int      `json:"scale,omitempty"`
	ScaleAgents    int      `json:"scaleAgents,omitempty"`
	ScaleSteady    duration `json:"scaleSteady,omitempty"`
	ScaleHeartbeat duration `json:"scaleHeartbeat,omitempty"`
	ScaleFaults    int      `json:"scaleFaults,omitempty"`
	Raw            string   `json:"raw"`
}

// duration is a time.Duration written as "15s" in JSON.
type duration time.Duration

func (d duration) String() string { return time.Duration(d).String() }

func (d duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

func (d *duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = duration(v)
	return err
}

// tag sets the part and run of figures a test wrote; a test that names them itself is wrong
// about where its figures come from.
func tag(figs []figure.Figure, part, run string) ([]figure.Figure, error) {
	for i := range figs {
		if figs[i].Part != "" || figs[i].Run != "" {
			return nil, fmt.Errorf("figure %s: part and run are hack/bench's to set", figs[i].ID())
		}
		figs[i].Part, figs[i].Run = part, run
	}
	return figs, nil
}

// readRun reads the figures one test run wrote to path and tags them with part and run.
func readRun(path, part, run string) ([]figure.Figure, error) {
	figs, err := figure.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return tag(figs, part, run)
}

// check rejects results that would render wrong: a figure without a part or run, or two
// figures at the same address (part, run, name, labels, unit), one of which a median would
// count twice.
func (r results) check() error {
	seen := map[string]bool{}
	for _, f := range r.Figures {
		if f.Part == "" || f.Run == "" {
			return fmt.Errorf("figure %s: no part or run", f.ID())
		}
		key := f.ID() + " " + f.Unit
		if seen[key] {
			return fmt.Errorf("figure %s in %s twice", f.ID(), f.Unit)
		}
		seen[key] = true
	}
	return nil
}

func saveResults(path string, r results) error {
	if err := r.check(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// loadResults reads a results.json strictly: unknown fields and malformed figures are errors.
func loadResults(path string) (results, error) {
	var r results
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	if dec.More() {
		return r, fmt.Errorf("%s: more than one JSON value", path)
	}
	if err := r.check(); err != nil {
		return r, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// lookup finds figures in the results. The first one it cannot find is kept in err, and every
// lookup after it returns zero, so that a renderer reads straight through and checks err once;
// a missing figure is never rendered as a zero.
type lookup struct {
	figs []figure.Figure
	err  error
}

func (l *lookup) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// all returns the figures of part with name, unit and labels (key, value pairs) in every run, in
// order, or none and an error.
func (l *lookup) all(part, name, unit string, labels ...string) []figure.Figure {
	if l.err != nil {
		return nil
	}
	var out []figure.Figure
	for _, f := range l.figs {
		if f.Part == part && f.Name == name && f.Unit == unit && hasLabels(f, labels) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		l.fail(fmt.Errorf("no figure %s in %s (part %s)", address(name, labels), unit, part))
	}
	return out
}

// address is a figure's name and labels as a lookup asks for them: name{key=value,...}.
func address(name string, labels []string) string {
	if len(labels) == 0 {
		return name
	}
	var kv []string
	for i := 0; i+1 < len(labels); i += 2 {
		kv = append(kv, labels[i]+"="+labels[i+1])
	}
	return name + "{" + strings.Join(kv, ",") + "}"
}

func hasLabels(f figure.Figure, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		if v, ok := f.Labels[kv[i]]; !ok || v != kv[i+1] {
			return false
		}
	}
	return true
}

// median is the median of the figure's value over the runs of part.
func (l *lookup) median(part, name, unit string, labels ...string) float64 {
	return median(collect(l.all(part, name, unit, labels...), func(f figure.Figure) float64 { return f.Value }))
}

// medianPercentile is the median of the figure's percentile p ("p99") over the runs of part.
func (l *lookup) medianPercentile(p, part, name, unit string, labels ...string) float64 {
	var v []float64
	for _, f := range l.all(part, name, unit, labels...) {
		x, err := f.Percentile(p)
		if err != nil {
			l.fail(err)
			return 0
		}
		v = append(v, x)
	}
	return median(v)
}

// one returns the figure of one run of part.
func (l *lookup) one(part, run, name, unit string, labels ...string) figure.Figure {
	for _, f := range l.all(part, name, unit, labels...) {
		if f.Run == run {
			return f
		}
	}
	l.fail(fmt.Errorf("no figure %s in %s (part %s, run %s)", name, unit, part, run))
	return figure.Figure{}
}

// hasFigure says whether part has any figure called name.
// sampleCount is the Samples of part's first figure name (0 when none).
func (l *lookup) sampleCount(part, name string) int {
	for _, f := range l.figs {
		if f.Part == part && f.Name == name {
			return f.Samples
		}
	}
	l.fail(fmt.Errorf("no figure %s in part %s", name, part))
	return 0
}

func (l *lookup) hasFigure(part, name string) bool {
	return slices.ContainsFunc(l.figs, func(f figure.Figure) bool { return f.Part == part && f.Name == name })
}

// has says whether part has any figure.
func (l *lookup) has(part string) bool {
	return slices.ContainsFunc(l.figs, func(f figure.Figure) bool { return f.Part == part })
}

// runs returns the runs of part in the order they were measured.
func (l *lookup) runs(part string) []string {
	var out []string
	for _, f := range l.figs {
		if f.Part == part && !slices.Contains(out, f.Run) {
			out = append(out, f.Run)
		}
	}
	return out
}

// labelValues returns the values of the label key on part's figures called name, in the order
// they first appear (the order the test measured them in), or an error if there are none.
func (l *lookup) labelValues(part, name, key string) []string {
	var out []string
	for _, f := range l.figs {
		if f.Part != part || f.Name != name {
			continue
		}
		v, ok := f.Labels[key]
		if !ok {
			l.fail(fmt.Errorf("figure %s has no label %s", f.ID(), key))
			return nil
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		l.fail(errors.New("no figure " + name + " (part " + part + ")"))
	}
	return out
}
