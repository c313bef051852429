package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestDiagEventsParse(t *testing.T) {
	sc := mustParseScenario(t, scenario("", "{at: 5s, gpu: 2, latent: {xid: 48}}", "{at: 6s, gpu: 2, diag: config}",
		fmt.Sprintf("{at: 7s, gpu: %s, diag: pass}", gpu(3))))
	want := []sim.Event{
		{At: 5 * time.Second, Kind: sim.EventLatent, GPU: 2, LatentXID: 48},
		{At: 6 * time.Second, Kind: sim.EventDiag, GPU: 2, Diag: sim.DiagConfig},
		{At: 7 * time.Second, Kind: sim.EventDiag, GPU: 3, Diag: sim.DiagPass},
	}
	for i, w := range want {
		got := sc.Events[i]
		if got.At != w.At || got.Kind != w.Kind || got.GPU != w.GPU || got.LatentXID != w.LatentXID || got.Diag != w.Diag {
			t.Errorf("event %d = %+v, want %+v", i, got, w)
		}
	}
	for _, w := range sim.DiagWords {
		mustParseScenario(t, scenario("", fmt.Sprintf("{at: 1s, gpu: 0, diag: %s}", w)))
	}
	// The simulated driver takes them as they are.
	if _, err := sim.ParseDriverScenario([]byte(scenario("", "{at: 5s, gpu: 2, latent: {xid: 48}}"))); err != nil {
		t.Error(err)
	}
}

func TestDiagEventErrors(t *testing.T) {
	for _, tc := range []struct {
		name, event string
		want        []string
	}{
		{"latent without an xid", "{at: 1s, gpu: 0, latent: {}}", []string{"line 6", "latent.xid: required"}},
		{"latent xid 0", "{at: 1s, gpu: 0, latent: {xid: 0}}", []string{"line 6", "latent.xid: must be a positive XID"}},
		{"latent xid negative", "{at: 1s, gpu: 0, latent: {xid: -48}}", []string{"line 6", `"-48"`}},
		{"latent unknown field", "{at: 1s, gpu: 0, latent: {xid: 48, after: 2s}}", []string{"line 6", `unknown field "after"`}},
		{"latent not a mapping", "{at: 1s, gpu: 0, latent: 48}", []string{"line 6"}},
		{"unknown word", "{at: 1s, gpu: 0, diag: broken}", []string{"line 6", "diag: must be one of pass, fail, config, skip, hang, unreachable, busy", `"broken"`}},
		{"word in capitals", "{at: 1s, gpu: 0, diag: Pass}", []string{"line 6", "diag: must be one of"}},
		{"latent after a reset", "{afterReset: 1s, gpu: 0, latent: {xid: 48}}", []string{"line 6", "afterReset: latent is a state a reset does not change"}},
		{"diag after a reset", "{afterReset: 1s, gpu: 0, diag: fail}", []string{"line 6", "afterReset: diag is a state"}},
		{"repeated", "{at: 1s, gpu: 0, diag: fail, repeat: 2}", []string{"line 6", "repeat: diag sets a state once"}},
		{"without a GPU", "{at: 1s, latent: {xid: 48}}", []string{"line 6", "gpu: required"}},
		{"GPU out of range", "{at: 1s, gpu: 9, diag: fail}", []string{"line 6", "gpu: index 9 is out of range"}},
		{"on a MIG instance", fmt.Sprintf("{at: 1s, gpu: %s, latent: {xid: 48}}", sim.MIGUUID("n1", 1, 1)), []string{"line 6", "concern the physical GPU"}},
		{"with an xid", "{at: 1s, gpu: 0, xid: 48, latent: {xid: 48}}", []string{"line 6", "xid and latent in one event"}},
		{"qualified", "{at: 1s, gpu: 0, diag: fail, xidSeverity: Fatal}", []string{"line 6", "only qualify an xid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(scenario("", tc.event)))
			wantOneLineError(t, err, tc.want...)
		})
	}
}

// diagDoc is what a test reads of a 4.x document: each test's status and warnings on the GPU.
type diagDoc struct {
	Diag struct {
		Categories []struct {
			Category string `json:"category"`
			Tests    []struct {
				Name    string `json:"name"`
				Results []struct {
					EntityGroupID int    `json:"entity_group_id"`
					EntityID      int    `json:"entity_id"`
					Status        string `json:"status"`
					Warnings      []struct {
						Warning  string `json:"warning"`
						ErrorID  int    `json:"error_id"`
						Severity int    `json:"error_severity"`
					} `json:"warnings"`
				} `json:"results"`
			} `json:"tests"`
		} `json:"test_categories"`
		RuntimeError string `json:"runtime_error"`
	} `json:"DCGM Diagnostic"`
}

// statuses maps "test" to its status on GPU gpu, and "test/warning" to each warning's
// "error_id/severity: text".
func statuses(t *testing.T, out []byte, gpu int) map[string]string {
	t.Helper()
	var doc diagDoc
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("not a JSON document: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, c := range doc.Diag.Categories {
		for _, test := range c.Tests {
			for _, r := range test.Results {
				if r.EntityGroupID != 1 || r.EntityID != gpu {
					t.Fatalf("%s: a result for entity %d/%d, want GPU %d alone", test.Name, r.EntityGroupID, r.EntityID, gpu)
				}
				m[test.Name] = r.Status
				for _, w := range r.Warnings {
					m[test.Name+"/warning"] += fmt.Sprintf("%d/%d: %s", w.ErrorID, w.Severity, w.Warning)
				}
			}
		}
	}
	if doc.Diag.RuntimeError != "" {
		m["runtime_error"] = doc.Diag.RuntimeError
	}
	return m
}

func TestDiagnoseAnswersPerWord(t *testing.T) {
	for _, tc := range []struct {
		word string
		code int
		want map[string]string // test -> status, or test/warning -> a substring of its warnings
	}{
		{"", 0, map[string]string{"software": "Pass", "memory": "Pass", "pcie": "Pass"}},
		{"pass", 0, map[string]string{"software": "Pass", "memory": "Pass", "pcie": "Pass"}},
		{"fail", 205, map[string]string{"software": "Pass", "memory": "Fail", "memory/warning": "58/2: A memory mismatch was detected on GPU 2", "pcie": "Pass"}},
		{"config", 226, map[string]string{"software": "Fail", "software/warning": "29/5: Persistence Mode: Persistence mode for GPU 2 is disabled.", "memory": "Pass", "pcie": "Pass"}},
		{"skip", 0, map[string]string{"software": "Skip", "memory": "Skip", "pcie": "Skip"}},
		{"busy", 217, map[string]string{"runtime_error": "Return: (-39)"}},
	} {
		t.Run(tc.word, func(t *testing.T) {
			events := []string{}
			if tc.word != "" {
				events = append(events, "{at: 0s, gpu: 2, diag: "+tc.word+"}")
			}
			b, _, _, _ := running(t, scenario("", events...))
			out, code, err := b.Diagnose(t.Context(), gpu(2))
			if err != nil || code != tc.code {
				t.Fatalf("Diagnose: exit %d, %v; want exit %d\n%s", code, err, tc.code, out)
			}
			got := statuses(t, out, 2)
			for k, w := range tc.want {
				if !strings.Contains(got[k], w) {
					t.Errorf("%s = %q, want %q\n%s", k, got[k], w, out)
				}
			}
			if tc.code != 217 && len(got) != len(tc.want) {
				t.Errorf("tests %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("unreachable", func(t *testing.T) {
		b, _, _, _ := running(t, scenario("", "{at: 0s, gpu: 2, diag: unreachable}"))
		out, code, err := b.Diagnose(t.Context(), gpu(2))
		if err != nil || code != 235 || !strings.Contains(string(out), "Error: unable to establish a connection to the specified host: localhost") {
			t.Fatalf("exit %d, %v:\n%s", code, err, out)
		}
	})
}

// A latent fault shows nothing to passive sampling or events, survives resets, fails a
// diagnostic under load naming its XID, and ends with diag: pass.
func TestLatentFaultOnlyADiagnosticFinds(t *testing.T) {
	b, rec, clk, done := running(t, scenario("gpus: {count: 4}\n", "{at: 5s, gpu: 2, latent: {xid: 48}}", "{at: 100s, gpu: 2, diag: pass}"))
	before := rec.count()
	clk.Step(5 * time.Second) // the latent event, no sampling round
	waitForWaiters(t, clk, done)
	if n := rec.count(); n != before {
		t.Fatalf("the latent event emitted %d signals", n-before)
	}
	if out, code, _ := b.Diagnose(t.Context(), gpu(2)); code != sim.DCGMExitIsolate ||
		!strings.Contains(statuses(t, out, 2)["memory/warning"], "101/4: Detected XID 48 for GPU 2") {
		t.Fatalf("diagnostic of the latent fault: exit %d\n%s", code, out)
	}
	if _, code, _ := b.Diagnose(t.Context(), gpu(1)); code != 0 {
		t.Fatalf("GPU 1's diagnostic exits %d, want 0", code)
	}
	for range 2 {
		if err := b.Reset(t.Context(), gpu(2)); err != nil {
			t.Fatal(err)
		}
		waitForWaiters(t, clk, done)
		if _, code, _ := b.Diagnose(t.Context(), gpu(2)); code != sim.DCGMExitIsolate {
			t.Fatalf("after a reset the diagnostic exits %d, want 205: a reset does not cure the latent fault", code)
		}
	}
	clk.Step(5 * time.Second) // a sampling round
	waitForWaiters(t, clk, done)
	if xids := rec.of(health.SignalXID, gpu(2)); len(xids) != 0 {
		t.Fatalf("passive signals saw XIDs %+v", xids)
	}
	for _, s := range rec.of(health.SignalECCCounters, gpu(2)) {
		if s.Uncorrected != 0 {
			t.Fatalf("a sample read uncorrected ECC errors: %+v", s)
		}
	}
	clk.Step(90 * time.Second) // diag: pass at 100s
	waitForWaiters(t, clk, done)
	if out, code, _ := b.Diagnose(t.Context(), gpu(2)); code != 0 {
		t.Fatalf("after diag: pass the diagnostic exits %d\n%s", code, out)
	}
}

func TestLatentFaultShowsOnlyUnderLoad(t *testing.T) {
	run := sim.DCGMRun{Version: sim.DCGMVersion4, GPU: 2, JSON: true, State: sim.DiagState{LatentXID: 48}}
	for level, want := range map[int]int{1: 0, 2: 205, 3: 205, 4: 205} {
		run.Level = level
		out, code := sim.DCGMDiag(run)
		if code != want {
			t.Errorf("level %d: exit %d, want %d\n%s", level, code, want, out)
		}
		if level >= 3 && statuses(t, out, 2)["diagnostic"] != "Fail" {
			t.Errorf("level %d: the diagnostic test does not fail\n%s", level, out)
		}
	}
	// Another XID than a DBE's is a TRIAGE finding: DCGM exits 226, not 205.
	run.Level, run.State.LatentXID = 2, 13
	if _, code := sim.DCGMDiag(run); code != sim.DCGMExitNVVSError {
		t.Errorf("latent XID 13: exit %d, want 226", code)
	}
}

func TestDiagnoseHangHonoursTheContext(t *testing.T) {
	b, _, _, _ := running(t, scenario("", "{at: 0s, gpu: 1, diag: hang}"))
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	out, code, err := b.Diagnose(ctx, gpu(1))
	if !errors.Is(err, context.DeadlineExceeded) || out != nil || code != 0 {
		t.Fatalf("Diagnose of a hanging GPU: %q, %d, %v; want the context's error", out, code, err)
	}
	// The slot is free again.
	if _, code, err := b.Diagnose(t.Context(), gpu(0)); err != nil || code != 0 {
		t.Fatalf("the next diagnostic: exit %d, %v", code, err)
	}
}

func TestOneDiagnosticAtATime(t *testing.T) {
	b, _, _, _ := running(t, scenario("", "{at: 0s, gpu: 1, diag: hang}"))
	ctx, cancel := context.WithCancel(t.Context())
	type result struct {
		code int
		err  error
	}
	hung := make(chan result, 1)
	hang := func() {
		go func() {
			_, code, err := b.Diagnose(ctx, gpu(1))
			hung <- result{code, err}
		}()
	}
	hang()
	// Until the hanging one holds the host engine, GPU 0's passes; then it is refused. (The
	// hanging one may itself meet GPU 0's and be refused: it is started again.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case r := <-hung:
			if r.err != nil || r.code != sim.DCGMExitAlreadyRunning {
				t.Fatalf("the hanging diagnostic returned: exit %d, %v", r.code, r.err)
			}
			hang()
		default:
		}
		out, code, err := b.Diagnose(t.Context(), gpu(0))
		if err != nil {
			t.Fatal(err)
		}
		if code == sim.DCGMExitAlreadyRunning {
			if !strings.Contains(statuses(t, out, 0)["runtime_error"], "A diag instance is already running") {
				t.Fatalf("busy answer:\n%s", out)
			}
			break
		}
		if code != 0 || time.Now().After(deadline) {
			t.Fatalf("exit %d while GPU 1's diagnostic hangs, want 0 then 217", code)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if r := <-hung; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the hanging diagnostic ended with exit %d, %v", r.code, r.err)
	}
	if _, code, _ := b.Diagnose(t.Context(), gpu(0)); code != 0 {
		t.Fatalf("after the hanging one ended: exit %d", code)
	}
}

func TestDiagnoseRefusesWhatIsNoGPU(t *testing.T) {
	b := sim.New(mustParseScenario(t, scenario("gpus: {count: 4, migInstances: {\"1\": 2}, missing: [3]}\n")), sim.Options{})
	for _, uuid := range []string{"GPU-nope", sim.MIGUUID("n1", 1, 1), gpu(3)} {
		if _, _, err := b.Diagnose(t.Context(), uuid); err == nil || !strings.Contains(err.Error(), "no such GPU") {
			t.Errorf("Diagnose(%s) = %v, want no such GPU", uuid, err)
		}
	}
	// It works without Run: a diagnostic needs no replay, the state is pass.
	if _, code, err := b.Diagnose(t.Context(), strings.ToLower(gpu(0))); err != nil || code != 0 {
		t.Errorf("Diagnose of GPU 0 before Run: exit %d, %v", code, err)
	}
}

func TestDiagnoseOfALostGPU(t *testing.T) {
	b, _, clk, done := running(t, scenario("gpus: {count: 2}\n", "{at: 1s, gpu: 1, lost: true}", "{at: 1s, gpu: 1, diag: hang}"))
	clk.Step(time.Second)
	waitForWaiters(t, clk, done)
	out, code, err := b.Diagnose(t.Context(), gpu(1))
	if err != nil || code != sim.DCGMExitGPULost || !strings.Contains(string(out), "GPU is lost") {
		t.Fatalf("Diagnose of a lost GPU: exit %d, %v\n%s", code, err, out)
	}
}

// Diagnose runs beside the replay and resets on other goroutines (go test -race checks it).
func TestDiagnoseIsSafeBesideTheReplay(t *testing.T) {
	events := []string{}
	for i := range 50 {
		events = append(events, fmt.Sprintf("{at: %dms, gpu: %d, diag: %s}", i, i%2, sim.DiagWords[i%4]),
			fmt.Sprintf("{at: %dms, gpu: %d, latent: {xid: 48}}", i, (i+1)%2))
	}
	b, _, clk, done := running(t, scenario("gpus: {count: 2}\n", events...))
	stop := make(chan struct{})
	diagnosed := make(chan struct{})
	go func() {
		defer close(diagnosed)
		for {
			select {
			case <-stop:
				return
			default:
				_, _, _ = b.Diagnose(t.Context(), gpu(0))
			}
		}
	}()
	for range 50 {
		clk.Step(time.Millisecond)
		waitForWaiters(t, clk, done)
	}
	close(stop)
	<-diagnosed
}
