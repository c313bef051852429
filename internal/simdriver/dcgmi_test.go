package simdriver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// A node whose GPU 2 has a latent XID 48 (it looks fine idle and fails under load), whose GPU 1
// has persistence mode off, and whose GPU 3's diagnostic hangs.
const diagGPUs = "node: sd-node\ngpus: {count: 4}\nevents:\n" +
	"  - {at: 0s, gpu: 2, latent: {xid: 48}}\n" +
	"  - {at: 0s, gpu: 1, diag: config}\n" +
	"  - {at: 0s, gpu: 3, diag: hang}\n"

type dcgmiResult struct {
	stdout, stderr string
	code           int
}

// dcgmi runs the dcgmi Serve installed in root, as a process of its own (it runs this test
// binary as `sim-driver dcgmi`, see TestMain).
func dcgmi(t *testing.T, root string, args ...string) dcgmiResult {
	t.Helper()
	return runDCGMI(t, exec.Command(filepath.Join(root, simdriver.DCGMIPath), args...))
}

// dcgmiVersion runs the same dcgmi with another DCGM version than the installed one's.
func dcgmiVersion(t *testing.T, root, version string, args ...string) dcgmiResult {
	t.Helper()
	return runDCGMI(t, exec.Command(os.Args[0], append([]string{"sim-driver", "dcgmi", "--driver-root", root, "--dcgm-version", version}, args...)...))
}

func runDCGMI(t *testing.T, cmd *exec.Cmd) dcgmiResult {
	t.Helper()
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%v: %v", cmd.Args, err)
	}
	return dcgmiResult{stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()}
}

// doc4 reads what a test checks of a 4.x document: each test's status on the one GPU it names,
// with its warnings' error IDs and severities.
func doc4(t *testing.T, out string) map[string]string {
	t.Helper()
	var d struct {
		Diag struct {
			Categories []struct {
				Tests []struct {
					Name    string `json:"name"`
					Results []struct {
						EntityID int    `json:"entity_id"`
						Status   string `json:"status"`
						Warnings []struct {
							Warning  string `json:"warning"`
							ErrorID  int    `json:"error_id"`
							Severity int    `json:"error_severity"`
						} `json:"warnings"`
					} `json:"results"`
				} `json:"tests"`
			} `json:"test_categories"`
			RuntimeError string `json:"runtime_error"`
		} `json:"DCGM Diagnostic"`
		Metadata struct {
			Version string `json:"version"`
			Driver  string `json:"Driver Version Detected"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	m := map[string]string{"version": d.Metadata.Version, "driver": d.Metadata.Driver, "runtime_error": d.Diag.RuntimeError}
	for _, c := range d.Diag.Categories {
		for _, test := range c.Tests {
			for _, r := range test.Results {
				m[test.Name] = r.Status
				for _, w := range r.Warnings {
					m[test.Name+"/warnings"] += w.Warning + " "
					m[test.Name+"/severity"] += string(rune('0' + w.Severity))
				}
				m["gpu"] = string(rune('0' + r.EntityID))
			}
		}
	}
	return m
}

// The installed dcgmi answers per GPU as DCGM would: the latent fault fails the memory test with
// XID 48 (exit 205), persistence mode off is a CONFIG finding (226), a healthy GPU passes, and
// `diag: pass` ends the latent fault. Resets do not.
func TestDCGMIDiagnosesTheSimulatedGPUs(t *testing.T) {
	s := serve(t, diagGPUs, "")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want map[string]string
	}{
		{"latent", []string{"diag", "-r", "2", "-i", "gpu:2", "-j"}, 205, map[string]string{"gpu": "2", "software": "Pass", "memory": "Fail", "memory/severity": "24", "pcie": "Pass"}},
		{"healthy", []string{"diag", "-r", "2", "-i", "gpu:0", "-j", "--host", "10.0.0.7:5555", "-p", "memory.test_duration=10", "-t", "600"}, 0, map[string]string{"gpu": "0", "software": "Pass", "memory": "Pass", "pcie": "Pass"}},
		{"config", []string{"diag", "--run", "2", "--entity-id", "1", "--json"}, 226, map[string]string{"gpu": "1", "software": "Fail", "software/severity": "5", "memory": "Pass"}},
		{"latent unseen at level 1", []string{"diag", "-r", "1", "-i", "gpu:2", "-j"}, 0, map[string]string{"gpu": "2", "software": "Pass"}},
		{"by UUID", []string{"diag", "-r", "medium", "-i", sim.GPUUUID("sd-node", 2), "-j"}, 205, map[string]string{"gpu": "2", "memory": "Fail"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := dcgmi(t, s.root, tc.args...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", r.code, tc.code, r.stdout, r.stderr)
			}
			got := doc4(t, r.stdout)
			tc.want["version"], tc.want["driver"] = sim.DCGMVersion4, "550.163.01"
			for k, w := range tc.want {
				if got[k] != w {
					t.Errorf("%s = %q, want %q\n%s", k, got[k], w, r.stdout)
				}
			}
		})
	}
	if r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:2", "-j"); !strings.Contains(doc4(t, r.stdout)["memory/warnings"], "Detected XID 48 for GPU 2") {
		t.Errorf("the failure does not name XID 48:\n%s", r.stdout)
	}
	// Passive NVML sees nothing of the latent fault: GPU 2 reads as the healthy GPU 0 does.
	probe := startChild(t, "probe", s.root)
	var rep struct {
		GPUs []struct {
			Readings map[string]any `json:"readings"`
		} `json:"gpus"`
	}
	for line := range probe.lines {
		if err := json.Unmarshal([]byte(line), &rep); err != nil {
			t.Fatal(err)
		}
	}
	if err := probe.wait(); err != nil {
		t.Fatal(err)
	}
	if len(rep.GPUs) != 4 {
		t.Fatalf("probe read %d GPUs", len(rep.GPUs))
	}
	delete(rep.GPUs[0].Readings, "time")
	delete(rep.GPUs[2].Readings, "time")
	if !reflect.DeepEqual(rep.GPUs[0].Readings, rep.GPUs[2].Readings) || rep.GPUs[2].Readings["ecc"] == nil {
		t.Errorf("GPU 2's readings %v differ from the healthy GPU 0's %v", rep.GPUs[2].Readings, rep.GPUs[0].Readings)
	}
	// A reset does not cure it; diag: pass does.
	if err := simdriver.Inject(s.root, "{gpu: 2, reset: true}"); err != nil {
		t.Fatal(err)
	}
	if r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:2", "-j"); r.code != 205 {
		t.Errorf("after a reset: exit %d, want 205", r.code)
	}
	if err := simdriver.Inject(s.root, "{gpu: 2, diag: pass}"); err != nil {
		t.Fatal(err)
	}
	if r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:2", "-j"); r.code != 0 || doc4(t, r.stdout)["memory"] != "Pass" {
		t.Errorf("after diag: pass: exit %d\n%s", r.code, r.stdout)
	}
	// Without -j, dcgmi's table; with 3.x, 3.x's document.
	if r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:1"); r.code != 226 || !strings.Contains(r.stdout, "| software                  | Warn ") {
		t.Errorf("the table: exit %d\n%s", r.code, r.stdout)
	}
	r := dcgmiVersion(t, s.root, sim.DCGMVersion3, "diag", "-r", "2", "-i", "0", "-j")
	var d3 map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &d3); r.code != 0 || err != nil || d3["version"] != sim.DCGMVersion3 || d3["DCGM GPU Diagnostic"] == nil {
		t.Errorf("3.x: exit %d, %v\n%s", r.code, err, r.stdout)
	}
}

// Injected words change what the next diagnostic answers; an unreachable GPU's host engine
// does not answer at all.
func TestDCGMIInjectedWords(t *testing.T) {
	s := serve(t, diagGPUs, "")
	for word, code := range map[string]int{"fail": 205, "skip": 0, "unreachable": 235, "busy": 217, "config": 226, "pass": 0} {
		if err := simdriver.Inject(s.root, "{gpu: 0, diag: "+word+"}"); err != nil {
			t.Fatal(err)
		}
		if r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:0", "-j"); r.code != code {
			t.Errorf("diag: %s: exit %d, want %d\n%s", word, r.code, code, r.stdout)
		}
	}
	if err := simdriver.Inject(s.root, "{gpu: 0, diag: maybe}"); !errors.Is(err, simdriver.ErrInjectRefused) ||
		!strings.Contains(err.Error(), "must be one of pass, fail, config, skip, hang, unreachable, busy") {
		t.Errorf("an unknown word: %v", err)
	}
}

// With no simulator serving the driver root, dcgmi says what DCGM says of an engine it cannot
// reach, and exits 235.
func TestDCGMIUnreachable(t *testing.T) {
	s := serve(t, diagGPUs, "")
	s.stop()
	r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:2", "-j", "--host", "10.0.0.7:5555")
	want := "Error: unable to establish a connection to the specified host: 10.0.0.7:5555\nError: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"
	if r.code != 235 || r.stdout != want {
		t.Errorf("exit %d, stdout %q; want 235 and %q", r.code, r.stdout, want)
	}
	if r := dcgmi(t, s.root, "discovery", "-l"); r.code != 235 {
		t.Errorf("discovery: exit %d, want 235", r.code)
	}
}

// One diagnostic at a time: while GPU 3's hangs, another is refused with 217; once the hanging
// dcgmi is killed, the host engine is free again. -t ends a hanging one with 203.
func TestDCGMIOneDiagnosticAtATime(t *testing.T) {
	s := serve(t, diagGPUs, "")
	ctx, cancel := context.WithCancel(t.Context())
	hung := exec.CommandContext(ctx, filepath.Join(s.root, simdriver.DCGMIPath), "diag", "-r", "2", "-i", "gpu:3", "-j")
	if err := hung.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = hung.Wait()
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:0", "-j")
		if r.code == 217 {
			if !strings.Contains(doc4(t, r.stdout)["runtime_error"], "A diag instance is already running") {
				t.Errorf("the refusal:\n%s", r.stdout)
			}
			break
		}
		if r.code != 0 || time.Now().After(deadline) {
			t.Fatalf("exit %d while GPU 3's diagnostic hangs; want 0 until it holds the engine, then 217\n%s", r.code, r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	_ = hung.Wait()
	deadline = time.Now().Add(30 * time.Second)
	for r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:0", "-j"); r.code != 0; r = dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:0", "-j") {
		if r.code != 217 || time.Now().After(deadline) {
			t.Fatalf("after the hanging dcgmi was killed: exit %d\n%s", r.code, r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:3", "-j", "-t", "1")
	if r.code != 203 || !strings.Contains(doc4(t, r.stdout)["runtime_error"], "Return: (-53)") {
		t.Errorf("-t 1 on a hanging diagnostic: exit %d\n%s", r.code, r.stdout)
	}
}

// The calls log has one line per call, with its arguments: a test can tell that only GPU 2 was
// ever asked for.
func TestDCGMICallsLog(t *testing.T) {
	s := serve(t, diagGPUs, "")
	for range 3 {
		dcgmi(t, s.root, "diag", "-r", "2", "-i", "gpu:2", "-j")
	}
	dcgmi(t, s.root, "discovery", "-l")
	f, err := os.Open(filepath.Join(s.root, simdriver.DCGMICallsLog))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var calls []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		when, call, _ := strings.Cut(sc.Text(), " ")
		if _, err := time.Parse(time.RFC3339Nano, when); err != nil {
			t.Errorf("line %q: %v", sc.Text(), err)
		}
		calls = append(calls, call)
	}
	want := []string{"dcgmi diag -r 2 -i gpu:2 -j", "dcgmi diag -r 2 -i gpu:2 -j", "dcgmi diag -r 2 -i gpu:2 -j", "dcgmi discovery -l"}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls %q, want %q", calls, want)
	}
}

func TestDCGMIDiscovery(t *testing.T) {
	s := serve(t, diagGPUs, "")
	r := dcgmi(t, s.root, "discovery", "-l")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "4 GPUs found.\n") {
		t.Fatalf("exit %d\n%s", r.code, r.stdout)
	}
	for i := range 4 {
		for _, want := range []string{"Device UUID: " + sim.GPUUUID("sd-node", i), "Name: " + sim.DefaultModel} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("no %q in\n%s", want, r.stdout)
			}
		}
	}
	if !strings.Contains(r.stdout, "| 2      | Name: ") || !strings.Contains(r.stdout, "|        | PCI Bus ID: 00000000:12:00.0") {
		t.Errorf("GPU 2's rows:\n%s", r.stdout)
	}
}

// What dcgmi refuses: options TCLAP does not know (exit 254, stderr), an entity list it cannot
// parse once connected (runtime_error, 255), 3.x's numbers-only -i.
func TestDCGMIRefusesBadCommandLines(t *testing.T) {
	s := serve(t, diagGPUs, "")
	for _, tc := range []struct {
		name     string
		version  string
		args     []string
		code     int
		out, err string
	}{
		{"unknown option", "", []string{"diag", "-r", "2", "-i", "gpu:2", "--bogus"}, 254, "", "Error: Couldn't find match for argument for arg --bogus.\nAn error occurred trying to parse the command line.\n"},
		{"no value", "", []string{"diag", "-r", "2", "-i"}, 254, "", "Missing a value for this argument! for arg -i."},
		{"bad level", "", []string{"diag", "-r", "9", "-i", "gpu:2"}, 254, "", "Invalid value '9' specified for -r."},
		{"timeout not a number", "", []string{"diag", "-r", "2", "-i", "gpu:2", "-t", "soon"}, 254, "", "Couldn't read argument value from string 'soon' for arg timeout"},
		{"group and entity", "", []string{"diag", "-r", "2", "-g", "1", "-i", "gpu:2"}, 254, "", "mutually exclusive"},
		{"malformed entity", "", []string{"diag", "-r", "2", "-i", "gpu:x", "-j"}, 255, `"runtime_error" : "Error: Error: Expected numerical entityId instead of x"`, ""},
		{"unknown entity type", "", []string{"diag", "-r", "2", "-i", "foo:2"}, 255, "Error: Error: invalid entity type: foo:2\n", ""},
		{"two GPUs", "", []string{"diag", "-r", "2", "-i", "gpu:1,gpu:2"}, 255, "diagnoses one GPU at a time", ""},
		{"no such GPU", "", []string{"diag", "-r", "2", "-i", "gpu:9", "-j"}, 255, "Return: (-1)", ""},
		{"3.x entity syntax", sim.DCGMVersion3, []string{"diag", "-r", "2", "-i", "gpu:2"}, 254, "", "Error: Invalid gpu list 'gpu:2'. The list must be a comma-separated list of numbers only.."},
		{"3.x entity-id", sim.DCGMVersion3, []string{"diag", "-r", "2", "--entity-id", "2"}, 254, "", "for arg --entity-id."},
		{"unknown subsystem", "", []string{"dmon"}, 255, "ERROR: Invalid subsystem.", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r dcgmiResult
			if tc.version == "" {
				r = dcgmi(t, s.root, tc.args...)
			} else {
				r = dcgmiVersion(t, s.root, tc.version, tc.args...)
			}
			if r.code != tc.code || !strings.Contains(r.stdout, tc.out) || !strings.Contains(r.stderr, tc.err) {
				t.Errorf("exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout with %q, stderr with %q", r.code, r.stdout, r.stderr, tc.code, tc.out, tc.err)
			}
		})
	}
}
