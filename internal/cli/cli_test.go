package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli"
)

var (
	exampleScenario = filepath.Join("..", "..", "examples", "scenario.yaml")
	exampleConfig   = filepath.Join("..", "..", "examples", "healthconfig.yaml")
)

func execute(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = cli.Execute(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func tempFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSimulateJSON(t *testing.T) {
	for _, args := range [][]string{
		{"simulate", "--scenario", exampleScenario},
		{"simulate", "--scenario", exampleScenario, "--output", "json"},
		{"simulate", "--scenario=" + exampleScenario, "-o", "json", "--config", exampleConfig},
	} {
		t.Run(strings.Join(args[1:], " "), func(t *testing.T) {
			code, stdout, stderr := execute(args...)
			if code != cli.ExitOK || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			var res struct {
				Node        string            `json:"node"`
				Devices     []json.RawMessage `json:"devices"`
				Transitions []json.RawMessage `json:"transitions"`
			}
			if err := json.Unmarshal([]byte(stdout), &res); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
			}
			if res.Node != "sim-node-0" || len(res.Devices) != 8 || len(res.Transitions) == 0 {
				t.Fatalf("result node %q, %d devices, %d transitions", res.Node, len(res.Devices), len(res.Transitions))
			}
		})
	}
}

func TestSimulateTable(t *testing.T) {
	code, stdout, stderr := execute("simulate", "--scenario", exampleScenario, "-o", "table")
	if code != cli.ExitOK || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"NODE sim-node-0", "TRANSITIONS (17)", "XID79", "7/gi2/ci0"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table does not contain %q:\n%s", want, stdout)
		}
	}
}

func TestSimulateExitsZeroWhenGPUsAreUnhealthy(t *testing.T) {
	sc := tempFile(t, "s.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 1}\nevents:\n  - {at: 1s, gpu: 0, xid: 79}\n")
	code, stdout, stderr := execute("simulate", "--scenario", sc)
	if code != cli.ExitOK || stderr != "" || !strings.Contains(stdout, `"health": "Unhealthy"`) {
		t.Fatalf("exit %d, stderr %q, stdout %s", code, stderr, stdout)
	}
}

func TestBadInputExitsTwoWithOneLine(t *testing.T) {
	dir := t.TempDir()
	badScenario := tempFile(t, "bad-scenario.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\nevents:\n  - {at: 5, gpu: 0, xid: 48}\n")
	outOfRange := tempFile(t, "range.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\nevents:\n  - {at: 5s, gpu: 7, xid: 48}\n")
	unknownField := tempFile(t, "unknown.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2, size: 3}\n")
	emptyScenario := tempFile(t, "empty.yaml", "")
	badConfig := tempFile(t, "bad-config.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nxids:\n  overrides:\n  - {xids: [13], severity: Healthy}\n  - {xids: [48], severity: Sick}\n")
	strictConfig := tempFile(t, "strict-config.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nchecks:\n  thermal: {slowdown: 80}\n")
	cases := []struct {
		name string
		args []string
		want []string // substrings of the one line on stderr
	}{
		{"no scenario", []string{"simulate"}, []string{"--scenario"}},
		{"scenario flag without a value", []string{"simulate", "--scenario"}, []string{"scenario"}},
		{"missing scenario file", []string{"simulate", "--scenario", filepath.Join(dir, "nope.yaml")}, []string{filepath.Join(dir, "nope.yaml")}},
		{"scenario is a directory", []string{"simulate", "--scenario", dir}, []string{dir}},
		{"duration without a unit", []string{"simulate", "--scenario", badScenario}, []string{badScenario, "line 5"}},
		{"gpu out of range", []string{"simulate", "--scenario", outOfRange}, []string{outOfRange, "line 5", "gpu"}},
		{"unknown field", []string{"simulate", "--scenario", unknownField}, []string{unknownField, "line 3", `"size"`}},
		{"empty scenario", []string{"simulate", "--scenario", emptyScenario}, []string{emptyScenario, "empty"}},
		{"a config given as the scenario", []string{"simulate", "--scenario", exampleConfig}, []string{exampleConfig, `unknown field "profile"`}},
		{"bad config", []string{"simulate", "--scenario", exampleScenario, "--config", badConfig}, []string{badConfig, "xids.overrides[1].severity"}},
		{"unknown config field", []string{"simulate", "--scenario", exampleScenario, "--config", strictConfig}, []string{strictConfig, "line 4", `"slowdown"`}},
		{"missing config file", []string{"simulate", "--scenario", exampleScenario, "--config", filepath.Join(dir, "nope.yaml")}, []string{filepath.Join(dir, "nope.yaml")}},
		{"a scenario given as the config", []string{"simulate", "--scenario", exampleScenario, "--config", exampleScenario}, []string{exampleScenario}},
		{"bad output", []string{"simulate", "--scenario", exampleScenario, "--output", "yaml"}, []string{"--output", `"yaml"`}},
		{"unknown flag", []string{"simulate", "--scenario", exampleScenario, "--verbose"}, []string{"--verbose"}},
		{"positional argument", []string{"simulate", "--scenario", exampleScenario, "extra"}, []string{"extra"}},
		{"unknown command", []string{"simulat"}, []string{"simulat", "did you mean simulate"}},
		{"unknown shorthand flag", []string{"simulate", "--scenario", exampleScenario, "-x"}, []string{"-x"}},
		{"flag value of the wrong type", []string{"breaker", "status", "--window", "soon"}, []string{"--window", "soon"}},
		{"unknown subcommand", []string{"breaker", "bogus"}, []string{"bogus", "gpuhealth breaker"}},
		{"argument to a cobra command", []string{"completion", "bash", "extra"}, []string{"extra"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := execute(tc.args...)
			if code != cli.ExitBadInput {
				t.Fatalf("exit %d, want %d; stderr %q", code, cli.ExitBadInput, stderr)
			}
			if stdout != "" {
				t.Fatalf("stdout %q, want nothing", stdout)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") || !strings.HasPrefix(stderr, "gpuhealth: ") {
				t.Fatalf("stderr %q, want exactly one line starting with \"gpuhealth: \"", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Fatalf("stderr %q does not mention %q", stderr, w)
				}
			}
			for _, noise := range []string{"goroutine", "panic", "Usage:"} {
				if strings.Contains(stderr, noise) {
					t.Fatalf("stderr %q contains %q", stderr, noise)
				}
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "simulate"},
		{[]string{"simulate", "--help"}, "--scenario"},
		{[]string{"version"}, "gpuhealth "},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := execute(tc.args...)
			if code != cli.ExitOK || stderr != "" || !strings.Contains(stdout, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		})
	}
}

func TestCancelledRunIsNotBadInput(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"simulate", "--scenario", exampleScenario}, &out, &errOut)
	if code != cli.ExitFailure || strings.Count(errOut.String(), "\n") != 1 {
		t.Fatalf("exit %d, stderr %q; want %d and one line", code, errOut.String(), cli.ExitFailure)
	}
}

// failingWriter fails every write with err.
type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

// TestFailuresThatReadLikeUsageErrorsAreNotBadInput: bad input is decided where an error arises,
// never by its text. A failure to write the result (EINVAL reads "invalid argument", as a bad
// flag value does) is the system's fault: exit 1.
func TestFailuresThatReadLikeUsageErrorsAreNotBadInput(t *testing.T) {
	stdout := failingWriter{&os.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EINVAL}}
	var errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"simulate", "--scenario", exampleScenario}, stdout, &errOut)
	if code != cli.ExitFailure || !strings.Contains(errOut.String(), "invalid argument") {
		t.Fatalf("exit %d, stderr %q; want %d and the write error", code, errOut.String(), cli.ExitFailure)
	}
}

func TestGroupsShowTheirHelpWhenRunAlone(t *testing.T) {
	for _, args := range [][]string{{}, {"breaker"}} {
		t.Run(strings.Join(append([]string{"gpuhealth"}, args...), " "), func(t *testing.T) {
			code, stdout, stderr := execute(args...)
			if code != cli.ExitOK || stderr != "" || !strings.Contains(stdout, "Available Commands:") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		})
	}
}
