// Package figure is the data format of every measured number behind docs/benchmarks.md: one
// JSON object per figure, one figure per line. The measuring tests (TestBenchSignalToObject,
// TestFleet) write their figures with WriteFile to the file their environment names; hack/bench
// reads them back with ReadFile, collects them with its own measurements and renders the
// document once from the result.
//
// Reading is strict: a line that is not a figure (bad JSON, a field this package does not know,
// no name, no unit or no value) is an error naming the line, never a figure of zero.
package figure

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Figure is one measured value.
type Figure struct {
	// Part and Run say where the figure comes from: hack/bench sets them when it collects a run
	// ("latency", "2"). The measuring tests leave them empty.
	Part string `json:"part,omitempty"`
	Run  string `json:"run,omitempty"`
	// Name says what was measured; Labels tell apart the figures of one name
	// ({"path": "fault -> DeviceTaintRule ADDED"}).
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Unit   string            `json:"unit"`
	Value  float64           `json:"value"`
	// Samples is how many observations Value sums up (faults timed, objects seen), and
	// Percentiles their distribution in Unit ("p50", "p99", "max").
	Samples     int                `json:"samples,omitempty"`
	Percentiles map[string]float64 `json:"percentiles,omitempty"`
	// By breaks Value down (requests by kind).
	By map[string]float64 `json:"by,omitempty"`
}

// Percentile returns the named percentile ("p50") or an error saying which figure lacks it.
func (f Figure) Percentile(p string) (float64, error) {
	v, ok := f.Percentiles[p]
	if !ok {
		return 0, fmt.Errorf("figure %s has no %s", f.ID(), p)
	}
	return v, nil
}

// ID names the figure for error messages: part, run, name and labels.
func (f Figure) ID() string {
	id := f.Name
	if len(f.Labels) > 0 {
		l, _ := json.Marshal(f.Labels) // sorted keys: the same labels give the same ID
		id += string(l)
	}
	if f.Part != "" || f.Run != "" {
		id = fmt.Sprintf("%s run %s: %s", f.Part, f.Run, id)
	}
	return id
}

// UnmarshalJSON decodes one figure strictly: unknown fields are errors, and so is a figure
// without a name, a unit or a value.
func (f *Figure) UnmarshalJSON(b []byte) error {
	type plain Figure // without this method
	var in struct {
		plain
		Value *float64 `json:"value"` // nil when absent: no silent zero
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return err
	}
	switch {
	case in.Name == "":
		return errors.New("figure without a name")
	case in.Unit == "":
		return fmt.Errorf("figure %s without a unit", in.Name)
	case in.Value == nil:
		return fmt.Errorf("figure %s without a value", in.Name)
	}
	*f = Figure(in.plain)
	f.Value = *in.Value
	return nil
}

// Write writes figs to w, one JSON object a line.
func Write(w io.Writer, figs ...Figure) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // "fault -> ..." stays readable
	for _, f := range figs {
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("figure %s: %w", f.ID(), err)
		}
	}
	return nil
}

// WriteFile replaces the file at path with figs.
func WriteFile(path string, figs ...Figure) error {
	var b bytes.Buffer
	if err := Write(&b, figs...); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// Read reads figures, one JSON object a line; blank lines are skipped. An error names the line.
func Read(r io.Reader) ([]Figure, error) {
	var figs []Figure
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var f Figure
		if err := json.Unmarshal(line, &f); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		figs = append(figs, f)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return figs, nil
}

// ReadFile reads the figures in the file at path; a file without any is an error.
func ReadFile(path string) ([]Figure, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	figs, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(figs) == 0 {
		return nil, fmt.Errorf("%s: no figures", path)
	}
	return figs, nil
}
