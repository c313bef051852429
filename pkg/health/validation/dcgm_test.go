package validation

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReadDCGM(t *testing.T) {
	tests := []struct {
		name    string
		fixture string // a file under testdata/
		output  string // used when fixture is empty
		exit    int
		gpu     int
		want    Result
		msg     []string // substrings of Message
		warn    []string // substrings, one per expected warning
		tests   []string // expected Verdict.Tests, when set
		version string
	}{
		// DCGM 4.x
		{
			name: "4.x pass", fixture: "dcgm4-pass.json", exit: 0, gpu: 2, want: Passed,
			msg:     []string{"3 tests passed: software, pcie, memory"},
			tests:   []string{"software: Pass", "pcie: Pass", "memory: Pass"},
			version: "4.2.3",
		},
		{
			name: "4.x ISOLATE failure", fixture: "dcgm4-fail-isolate.json", exit: 205, gpu: 2, want: Failed,
			msg: []string{`memory: Fail: "CUDA APIs have indicated that a double-bit ECC error has occured on GPU 2." (DCGM error 57, severity ISOLATE)`}, //nolint:misspell // DCGM's own words (dcgm_errors.h)
		},
		{
			name: "4.x ISOLATE failure with exit 226", fixture: "dcgm4-fail-isolate.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{"DCGM error 57"},
		},
		{
			name:    "4.x CONFIG warning only (persistence mode, exit 226) passes with the warning",
			fixture: "dcgm4-config-warning.json", exit: 226, gpu: 2, want: Passed,
			msg:  []string{"1 test passed: memory", "1 warning"},
			warn: []string{`software: "Persistence mode for GPU 2 is disabled.`, "(DCGM error 29, severity CONFIG)"},
		},
		{
			name: "4.x MONITOR beside TRIAGE in one result fails", fixture: "dcgm4-monitor-and-triage.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{"targeted_stress: Fail", "severity MONITOR", "Detected XID 79 for GPU 2", "severity TRIAGE"},
		},
		{
			name: "4.x every result skipped", fixture: "dcgm4-skip-only.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"no test ran on GPU 2", "memory, pcie"},
		},
		{
			name: "4.x another GPU's failure does not fail this GPU", fixture: "dcgm4-other-gpu-fail.json", exit: 205, gpu: 2, want: Passed,
			msg:   []string{"2 tests passed: software, memory"},
			tests: []string{"software: Pass", "memory: Pass"},
		},
		{
			name: "4.x the other GPU's own verdict", fixture: "dcgm4-other-gpu-fail.json", exit: 205, gpu: 0, want: Failed,
			msg: []string{"GPU 0", "severity ISOLATE"},
		},
		{
			name: "4.x node-wide failure (no entity) fails every GPU", fixture: "dcgm4-node-wide-fail.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{"software: Fail", "cuInit", "DCGM error 11, severity TRIAGE"},
		},
		{
			name: "4.x truncated JSON", fixture: "dcgm4-truncated.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"the output does not parse as dcgmi diag JSON", "truncated"},
		},
		{
			name: "empty output", output: "", exit: 0, gpu: 2, want: Error,
			msg: []string{"the output does not parse as dcgmi diag JSON", "empty"},
		},
		{
			name: "output without JSON", output: "Successfully ran diagnostic for group.\n", exit: 0, gpu: 2, want: Error,
			msg: []string{"the output does not parse as dcgmi diag JSON", "no '{'", "Successfully ran"},
		},
		{
			name: "JSON that is not a diag document", output: `{"kind": "Status"}`, exit: 0, gpu: 2, want: Error,
			msg: []string{"the output does not parse as dcgmi diag JSON", `"kind"`},
		},
		{
			name: "4.x runtime_error", fixture: "dcgm4-runtime-error.json", exit: 226, gpu: 2, want: Error,
			msg:     []string{"dcgmi diag could not run (exit 226)", "MIG mode is enabled"},
			version: "4.2.3",
		},
		{
			name: "4.x iterations: a failure in any iteration fails", fixture: "dcgm4-iterations-fail.json", exit: 205, gpu: 2, want: Failed,
			msg: []string{"iteration 2: memory: Fail", "DCGM error 57"},
		},
		{
			name: "4.x iterations: all pass", fixture: "dcgm4-iterations-pass.json", exit: 0, gpu: 2, want: Passed,
			msg: []string{"3 tests passed", "(3 iterations)"},
		},
		{
			name: "4.x banner and trailer around the document", fixture: "dcgm4-banner.txt", exit: 0, gpu: 2, want: Passed,
			msg: []string{"3 tests passed"},
		},
		{
			name: "4.x unknown status word", fixture: "dcgm4-unknown-status.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"unknown test status", `memory: "Inconclusive"`},
		},
		{
			name: "4.x exit 226 but no Fail in the document", fixture: "dcgm4-pass.json", exit: 226, gpu: 2, want: Error,
			msg: []string{"exit 226 says a test failed but the document shows none"},
		},
		{
			name: "4.x exit 205 but no Fail in the document", fixture: "dcgm4-pass.json", exit: 205, gpu: 2, want: Error,
			msg: []string{"exit 205 says a test failed"},
		},
		{
			name: "4.x exit 0 with a failure for this GPU", fixture: "dcgm4-fail-isolate.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 0 but the document shows a failure on GPU 2"},
		},
		{
			name: "4.x exit 217: a diag is already running", fixture: "dcgm4-busy.json", exit: 217, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 217: a diagnostic is already running on the host engine", "already running"},
		},
		{
			name: "exit 217 without a document", output: "Error: A diag instance is already running\n", exit: 217, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 217: a diagnostic is already running on the host engine"},
		},
		{
			name: "exit 235: no host engine", output: "Error: unable to establish a connection to the specified host: localhost\n", exit: 235, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 235: the connection to the host engine is not valid"},
		},
		{
			name: "exit 203: nvvs killed", fixture: "dcgm4-fail-isolate.json", exit: 203, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 203: nvvs was killed"},
		},
		{
			name: "exit 254: exception", output: "basic_string::_M_create\n", exit: 254, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 254: dcgmi hit an exception"},
		},
		{
			name: "other non-zero exit without a document", output: "Usage: dcgmi diag ...\nmore\nand more\nand even more\n", exit: 255, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 255 (bad parameter): Usage: dcgmi diag ... | more | and more"},
		},
		{
			name: "other non-zero exit with a document", fixture: "dcgm4-pass.json", exit: 1, gpu: 2, want: Error,
			msg: []string{"dcgmi exited 1, which is not a test verdict"},
		},
		{
			name: "killed by a signal", fixture: "dcgm4-pass.json", exit: -1, gpu: 2, want: Error,
			msg: []string{"did not exit normally"},
		},
		{
			name: "4.x no result for this GPU", fixture: "dcgm4-wrong-gpu.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"no result for GPU 2 in the diag's output"},
		},

		// DCGM 3.x
		{
			name: "3.x pass", fixture: "dcgm3-pass.json", exit: 0, gpu: 2, want: Passed,
			msg:     []string{"11 tests passed: Denylist", "PCIe, GPU Memory"},
			version: "3.3.9",
		},
		{
			name: "3.x ISOLATE failure", fixture: "dcgm3-fail-isolate.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{`GPU Memory: Fail: "CUDA APIs`, "(DCGM error 57, severity ISOLATE)"},
		},
		{
			name:    "3.x deployment CONFIG warning (gpu_id a number, text under \"warnings\")",
			fixture: "dcgm3-deployment-warning.json", exit: 226, gpu: 2, want: Passed,
			warn: []string{`Persistence Mode: "Persistence mode for GPU 2 is disabled.`},
		},
		{
			name: "3.x deployment warning names another GPU", fixture: "dcgm3-deployment-warning.json", exit: 226, gpu: 0, want: Error,
			msg: []string{"no result for GPU 0"},
		},
		{
			name: "3.x node-wide deployment failure (gpu_id -1)", fixture: "dcgm3-node-wide-fail.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{"NVML Library: Fail", "libnvidia-ml.so.1", "severity TRIAGE"},
		},
		{
			name: "3.x warnings as plain strings: severity unknown fails", fixture: "dcgm3-string-warnings.json", exit: 226, gpu: 2, want: Failed,
			msg: []string{"GPU Memory: Fail", "memory mismatch", "(severity unknown)"},
		},
		{
			name: "3.x another GPU's failure does not fail this GPU", fixture: "dcgm3-other-gpu-fail.json", exit: 226, gpu: 2, want: Passed,
		},
		{
			name: "3.x the other GPU's own verdict", fixture: "dcgm3-other-gpu-fail.json", exit: 226, gpu: 0, want: Failed,
		},
		{
			name: "3.x only node-wide deployment checks: nothing ran on the GPU", fixture: "dcgm3-deployment-only.json", exit: 0, gpu: 2, want: Error,
			msg: []string{"no result for GPU 2"},
		},

		// Hand-written edges.
		{
			name: "Fail with no warnings is a failure", exit: 226, gpu: 2, want: Failed,
			output: `{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
				{"entity_group":"GPU","entity_group_id":1,"entity_id":2,"status":"Fail"}]}]}]}}`,
			msg: []string{"memory: Fail (DCGM gave no reason)"},
		},
		{
			name: "CONFIG warning without severity is a failure", exit: 226, gpu: 2, want: Failed,
			output: `{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
				{"entity_group_id":1,"entity_id":2,"status":"Pass"}]},{"name":"software","results":[
				{"entity_group_id":1,"entity_id":2,"status":"Fail","warnings":[{"warning":"x","error_id":29}]}]}]}]}}`,
			msg: []string{"(DCGM error 29, severity unknown)"},
		},
		{
			name: "Not Run counts as skipped", exit: 0, gpu: 2, want: Error,
			output: `{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
				{"entity_group":"GPU","entity_group_id":1,"entity_id":2,"status":"Not Run"}]}]}]}}`,
			msg: []string{"no test ran on GPU 2"},
		},
		{
			name: "only warnings for this GPU, no pass", exit: 226, gpu: 2, want: Error,
			output: `{"DCGM Diagnostic":{"test_categories":[{"category":"Deployment","tests":[{"name":"software","results":[
				{"entity_group":"GPU","entity_group_id":1,"entity_id":2,"status":"Fail","warnings":[
				{"warning":"pm off","error_id":29,"error_category":8,"error_severity":5}]}]}]}]}}`,
			msg:  []string{"no test passed on GPU 2"},
			warn: []string{"pm off"},
		},
		{
			name: "entity id that is not a number", exit: 0, gpu: 2, want: Error,
			output: `{"DCGM Diagnostic":{"test_categories":[{"category":"Hardware","tests":[{"name":"memory","results":[
				{"entity_group_id":1,"entity_id":2,"status":"Pass"},{"entity_group_id":1,"entity_id":"two","status":"Pass"}]}]}]}}`,
			msg: []string{"cannot tell which GPU", `"two"`},
		},
		{
			name: "a runtime_error document before the iterations document", exit: 226, gpu: 2, want: Error,
			output: "{\"DCGM Diagnostic\":{\"version\":\"4.2.3\",\"runtime_error\":\"Error: nvvs crashed\"}}\n" +
				"{\"iterations\":[null],\"Overall Result\":\"Fail\"}\n",
			msg: []string{"could not run", "nvvs crashed"},
		},
		{
			name: "an iteration without results", exit: 226, gpu: 2, want: Error,
			output: `{"iterations":[null],"Overall Result":"Fail","Warning":"Host engine connection invalid/disconnected"}`,
			msg:    []string{"iteration 1 of the diag has no results"},
		},
		{
			name: "unknown extra fields are ignored", exit: 0, gpu: 2, want: Passed,
			output: `{"schema":7,"DCGM Diagnostic":{"extra":{"a":[1]},"test_categories":[{"category":"Hardware","weight":1.5,"tests":[{"name":"memory","duration_ms":18000,"results":[
				{"entity_group":"GPU","entity_group_id":1,"entity_id":2,"status":"Pass","aux":{"x":true}}]}]}]}}`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := []byte(tc.output)
			if tc.fixture != "" {
				out = fixture(t, tc.fixture)
			}
			v := ReadDCGM(out, tc.exit, Target{DCGMID: tc.gpu})
			t.Logf("%s: %s; warnings %q", v.Result, v.Message, v.Warnings)
			if v.Result != tc.want {
				t.Fatalf("Result = %q, want %q; message: %s", v.Result, tc.want, v.Message)
			}
			if v.Message == "" {
				t.Error("empty Message")
			}
			for _, s := range tc.msg {
				if !strings.Contains(v.Message, s) {
					t.Errorf("Message %q does not contain %q", v.Message, s)
				}
			}
			if tc.warn != nil {
				if len(v.Warnings) != 1 {
					t.Errorf("Warnings = %q, want one", v.Warnings)
				}
				for _, s := range tc.warn {
					if !slices.ContainsFunc(v.Warnings, func(w string) bool { return strings.Contains(w, s) }) {
						t.Errorf("Warnings %q do not contain %q", v.Warnings, s)
					}
				}
			} else if v.Result == Passed && len(v.Warnings) > 0 && !strings.Contains(tc.name, "warning") {
				t.Errorf("unexpected Warnings %q", v.Warnings)
			}
			if tc.tests != nil && !slices.Equal(v.Tests, tc.tests) {
				t.Errorf("Tests = %q, want %q", v.Tests, tc.tests)
			}
			if tc.version != "" && v.Version != tc.version {
				t.Errorf("Version = %q, want %q", v.Version, tc.version)
			}
			if len(v.Message) > maxMessage || !utf8.ValidString(v.Message) {
				t.Errorf("Message is %d bytes or not valid UTF-8", len(v.Message))
			}
		})
	}
}

// A failure that names every test of a long run stays within an Event's note.
func TestReadDCGMMessageBounded(t *testing.T) {
	long := strings.Repeat("é", 2000)
	var b strings.Builder
	b.WriteString(`{"DCGM Diagnostic":{"test_categories":[{"category":"Stress","tests":[`)
	for i := range 20 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"name":"t","results":[{"entity_group_id":1,"entity_id":2,"status":"Fail","warnings":[{"warning":"` +
			long + `","error_id":95,"error_category":1,"error_severity":2}]}]}`)
	}
	b.WriteString(`]}]}}`)
	v := ReadDCGM([]byte(b.String()), 205, Target{DCGMID: 2})
	if v.Result != Failed {
		t.Fatalf("Result = %q: %s", v.Result, v.Message)
	}
	if len(v.Message) > maxMessage || !utf8.ValidString(v.Message) {
		t.Errorf("Message is %d bytes (max %d) or not valid UTF-8", len(v.Message), maxMessage)
	}
}
