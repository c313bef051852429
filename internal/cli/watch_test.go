package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

const watchScenario = `apiVersion: gpuhealth.dev/v1alpha1
kind: Scenario
node: watch-node
gpus: {count: 2}
duration: 2s
events:
  - {at: 0s, gpu: 0, xid: 79}
  - {at: 1s, gpu: 1, temperatureC: 91}
`

const watchConfig = `apiVersion: gpuhealth.dev/v1alpha1
kind: HealthConfig
sampleInterval: 1s
`

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type watchLine struct {
	Time   time.Time `json:"time"`
	Index  *int      `json:"index"`
	UUID   string    `json:"uuid"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
}

func TestWatchSimJSON(t *testing.T) {
	scenario := writeFile(t, "scenario.yaml", watchScenario)
	config := writeFile(t, "config.yaml", watchConfig)
	var stdout, stderr bytes.Buffer
	before := time.Now()
	code := cli.Execute(context.Background(),
		[]string{"watch", "--backend", "sim", "--scenario", scenario, "--config", config, "--output", "json"}, &stdout, &stderr)
	if code != cli.ExitOK {
		t.Fatalf("exit code = %d, stderr %q", code, stderr.String())
	}
	var got []watchLine
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var l watchLine
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, l)
	}
	want := []watchLine{
		{UUID: sim.GPUUUID("watch-node", 0), From: "Healthy", To: "Unhealthy", Reason: "XID79"},
		{UUID: sim.GPUUUID("watch-node", 1), From: "Healthy", To: "Degraded", Reason: "TemperatureAtSlowdown"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d transitions %+v, want %d", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.UUID != w.UUID || g.From != w.From || g.To != w.To || g.Reason != w.Reason || g.Index == nil || *g.Index != i {
			t.Errorf("transition %d = %+v, want %+v at index %d", i, g, w, i)
		}
		// The sim backend runs on the real clock.
		if g.Time.Before(before.Add(-time.Second)) {
			t.Errorf("transition %d at %v, before the command started (%v)", i, g.Time, before)
		}
	}
}

func TestWatchSimTable(t *testing.T) {
	scenario := writeFile(t, "scenario.yaml", watchScenario)
	config := writeFile(t, "config.yaml", watchConfig)
	var stdout, stderr bytes.Buffer
	code := cli.Execute(context.Background(), []string{"watch", "--backend", "sim", "--scenario", scenario, "--config", config}, &stdout, &stderr)
	if code != cli.ExitOK {
		t.Fatalf("exit code = %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"watching 2 devices", "Healthy -> Unhealthy", "XID79", "Healthy -> Degraded"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestWatchStopsWhenInterrupted(t *testing.T) {
	scenario := writeFile(t, "scenario.yaml", strings.Replace(watchScenario, "duration: 2s", "duration: 1h", 1))
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(ctx, []string{"watch", "--backend", "sim", "--scenario", scenario, "--output", "json"}, &stdout, &stderr)
	}()
	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Errorf("exit code = %d, want 0 after an interrupt (stderr %q)", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("watch did not stop after its context was cancelled")
	}
}

func TestWatchBadInput(t *testing.T) {
	scenario := writeFile(t, "scenario.yaml", watchScenario)
	tests := []struct {
		name string
		args []string
	}{
		{"unknown backend", []string{"watch", "--backend", "dcgm"}},
		{"sim without scenario", []string{"watch", "--backend", "sim"}},
		{"nvml with scenario", []string{"watch", "--backend", "nvml", "--scenario", scenario}},
		{"bad output", []string{"watch", "--backend", "sim", "--scenario", scenario, "--output", "yaml"}},
		{"missing scenario file", []string{"watch", "--backend", "sim", "--scenario", filepath.Join(t.TempDir(), "none.yaml")}},
		{"bad config", []string{"watch", "--backend", "sim", "--scenario", scenario, "--config", writeFile(t, "bad.yaml", "kind: Nope\n")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := cli.Execute(context.Background(), tc.args, &stdout, &stderr); code != cli.ExitBadInput {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, cli.ExitBadInput, stderr.String())
			}
		})
	}
}
