package simdriver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	"github.com/gpuhealth/gpuhealth/internal/simulate"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/docsection"
)

// The equivalence test replays every scenario file of the repository twice: through the sim
// backend (`gpuhealth simulate`, on virtual time: the reference) and through gpuhealth's NVML
// backend, by go-nvml's real cgo path, on the simulated driver serving the same scenario on a
// running clock. Both feed the same health library under the default policy. Per GPU and MIG
// instance they must end with the same health, eviction, conditions and XID counts, after the
// same transitions (from, to, reason, in order, at times within equivalenceSlack of each other),
// except where a real driver cannot agree with the sim backend; each such device is declared in
// equivalenceScenarios with why, and a declared difference that goes away fails the test too.
//
// The running clock is the real one sped up equivalenceSpeed times (an hour of scenario takes a
// minute). Both the simulator's timeline and the NVML backend's sampler and signal times follow
// it; the driver's own timeouts stay real.

const (
	equivalenceSpeed = 60
	// equivalenceSlack is how far apart the two backends may see the same transition: a polled
	// reading shows in the NVML backend's next sampling round, which may be the round at the
	// event's own instant or the one after it, plus the running clock's jitter.
	equivalenceSlack = 2*sim.DefaultSampleEvery + 5*time.Second
)

// equivalenceScenario is a scenario file and the devices (by index, "7/gi2/ci0" for a MIG
// instance) on which the two backends are known to disagree, with why.
type equivalenceScenario struct {
	file   string
	differ map[string]string
}

// Why a real driver cannot agree with the sim backend (docs/nvml.md explains each).
const (
	whyResetRefused = "reset refused while held"
	whyQueueBounded = "event queue bounded"
)

var equivalenceScenarios = []equivalenceScenario{
	{file: "examples/scenario.yaml", differ: map[string]string{
		"0":         whyResetRefused + "; " + whyQueueBounded,
		"1":         whyResetRefused,
		"2":         whyResetRefused,
		"7/gi2/ci0": whyResetRefused,
	}},
	{file: "examples/demo-scenario.yaml", differ: map[string]string{}},
	{file: "pkg/gpu/sim/testdata/issue-example.yaml", differ: map[string]string{}},
	{file: "internal/simulate/testdata/faults.yaml", differ: map[string]string{}},
	{file: "internal/simdriver/testdata/every-event.yaml", differ: map[string]string{}},
	{file: "examples/early-warnings.yaml", differ: map[string]string{}},
}

// notServed matches the scenario lines no driver serves: kernel-log lines (the agent reads them
// from /dev/kmsg, not NVML) and node reboots. Both replays go without them.
var notServed = regexp.MustCompile(`(?m)^\s*- \{.*\b(kmsg|reboot):.*\}\s*(#.*)?$`)

func TestEquivalenceWithTheSimBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("replays every scenario on a running clock")
	}
	var table strings.Builder
	table.WriteString("| scenario | devices | agree | events no driver serves | differ, and why |\n|---|---|---|---|---|\n")
	rows := make([]string, len(equivalenceScenarios))
	t.Run("scenarios", func(t *testing.T) {
		for i, es := range equivalenceScenarios {
			t.Run(filepath.Base(es.file), func(t *testing.T) {
				t.Parallel()
				rows[i] = checkEquivalence(t, es)
			})
		}
	})
	for _, r := range rows {
		if r == "" || t.Failed() { // not every scenario ran (-run) or agreed: nothing to write
			return
		}
		table.WriteString(r)
	}
	docsection.Check(t, "../../docs/nvml.md", "equivalence", table.String(), "go test ./internal/simdriver -run Equivalence")
}

// checkEquivalence replays one scenario through both backends and compares them; it returns the
// scenario's row of the docs table.
func checkEquivalence(t *testing.T, es equivalenceScenario) string {
	data, err := os.ReadFile(filepath.Join("../..", es.file))
	if err != nil {
		t.Fatal(err)
	}
	full, err := sim.ParseScenario(data)
	if err != nil {
		t.Fatal(err)
	}
	stripped := notServed.ReplaceAll(data, nil)
	sc, err := sim.ParseDriverScenario(stripped)
	if err != nil {
		t.Fatalf("%s without kmsg lines and reboots: %v", es.file, err)
	}
	dropped := len(full.Events) - len(sc.Events)
	want := 0
	for _, ev := range full.Events {
		if ev.Kind == sim.EventKmsg || ev.Kind == sim.EventReboot {
			want++
		}
	}
	if dropped != want {
		t.Fatalf("%s: %d kmsg and reboot events, %d lines stripped", es.file, want, dropped)
	}

	policy := health.DefaultPolicy()
	ref, err := simulate.Run(context.Background(), sc, policy, simulate.Options{SampleInterval: sim.DefaultSampleEvery})
	if err != nil {
		t.Fatal(err)
	}

	root, err := os.MkdirTemp("", "sq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	child := startChild(t, "equivalence", root, "GPUHEALTH_SIMDRIVER_SCENARIO="+string(stripped),
		"GPUHEALTH_SIMDRIVER_LIBS="+libraryDir, "GPUHEALTH_SIMDRIVER_SPEED="+strconv.Itoa(equivalenceSpeed))
	var lines []string
	for l := range child.lines {
		lines = append(lines, l)
	}
	if err := child.wait(); err != nil {
		t.Fatalf("the NVML replay: %v", err)
	}
	if len(lines) == 0 {
		t.Fatal("the NVML replay printed no result")
	}
	var got simulate.Result
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("the NVML replay's result: %v", err)
	}

	differ, worst := compareResults(ref, &got)
	devices, agree := 0, 0
	for _, d := range ref.Devices {
		for _, key := range append([]string{strconv.Itoa(d.Index)}, migKeys(d)...) {
			devices++
			diff, differs := differ[key]
			why, declared := es.differ[key]
			switch {
			case differs && !declared:
				t.Errorf("%s, device %s: the backends disagree: %s", es.file, key, diff)
			case !differs && declared:
				t.Errorf("%s, device %s: declared to differ (%s) but the backends agree", es.file, key, why)
			case differs:
				t.Logf("%s, device %s differs, as declared (%s): %s", es.file, key, why, diff)
			default:
				agree++
			}
		}
	}
	t.Logf("%s: %d of %d devices agree; the largest time apart of a shared transition is %s", es.file, agree, devices, worst)

	byWhy := map[string][]string{}
	for key, why := range es.differ {
		for _, w := range strings.Split(why, "; ") {
			byWhy[w] = append(byWhy[w], key)
		}
	}
	var whys []string
	for _, w := range slices.Sorted(maps.Keys(byWhy)) {
		keys := byWhy[w]
		slices.Sort(keys)
		whys = append(whys, fmt.Sprintf("%s: %s", w, strings.Join(keys, ", ")))
	}
	notes := "none"
	if want > 0 {
		notes = fmt.Sprintf("%d (kmsg lines, reboots)", want)
	}
	return fmt.Sprintf("| `%s` | %d | %d | %s | %s |\n", es.file, devices, agree, notes, orNone(strings.Join(whys, "; ")))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func migKeys(d simulate.Device) []string {
	var keys []string
	for _, m := range d.MIGDevices {
		keys = append(keys, fmt.Sprintf("%d/gi%d/ci%d", d.Index, m.GPUInstance, m.ComputeInstance))
	}
	return keys
}

// compareResults returns what differs per device key, and the largest time apart of the
// transitions both have.
func compareResults(ref, got *simulate.Result) (map[string]string, time.Duration) {
	differ := map[string]string{}
	var worst time.Duration
	byUUID := map[string]string{} // UUID -> device key
	type state struct {
		health string
		evict  bool
		conds  []string
		xids   []string
		since  map[string]time.Duration // condition reason -> since
	}
	collect := func(res *simulate.Result) map[string]state {
		out := map[string]state{}
		cond := func(cs []simulate.Condition) []string {
			var s []string
			for _, c := range cs {
				s = append(s, fmt.Sprintf("%s/%s/%s", c.Type, c.Reason, c.Severity))
			}
			slices.Sort(s)
			return s
		}
		xid := func(xs []simulate.XIDCount) []string {
			var s []string
			for _, x := range xs {
				s = append(s, fmt.Sprintf("%d×%d", x.XID, x.Count))
			}
			return s
		}
		for _, d := range res.Devices {
			since := func(cs []simulate.Condition) map[string]time.Duration {
				m := map[string]time.Duration{}
				for _, c := range cs {
					m[c.Reason] = time.Duration(c.Since)
				}
				return m
			}
			key := strconv.Itoa(d.Index)
			byUUID[d.UUID] = key
			out[key] = state{d.Health, d.Evict, cond(d.Conditions), xid(d.XIDs), since(d.Conditions)}
			for i, m := range d.MIGDevices {
				mk := migKeys(d)[i]
				byUUID[m.UUID] = mk
				out[mk] = state{m.Health, m.Evict, cond(m.Conditions), xid(m.XIDs), since(m.Conditions)}
			}
		}
		return out
	}
	refState, gotState := collect(ref), collect(got)
	for key, r := range refState {
		g, ok := gotState[key]
		if !ok {
			differ[key] = "the NVML backend does not have it"
			continue
		}
		var d []string
		if r.health != g.health || r.evict != g.evict {
			d = append(d, fmt.Sprintf("health %s (evict %t) vs %s (evict %t)", r.health, r.evict, g.health, g.evict))
		}
		if !slices.Equal(r.conds, g.conds) {
			d = append(d, fmt.Sprintf("conditions %v vs %v", r.conds, g.conds))
		}
		if !slices.Equal(r.xids, g.xids) {
			d = append(d, fmt.Sprintf("XIDs %v vs %v", r.xids, g.xids))
		}
		if len(d) > 0 {
			differ[key] = strings.Join(d, "; ")
		}
	}
	for key := range gotState {
		if _, ok := refState[key]; !ok {
			differ[key] = "only the NVML backend has it"
		}
	}
	perDevice := func(res *simulate.Result) map[string][]simulate.Transition {
		out := map[string][]simulate.Transition{}
		for _, tr := range res.Transitions {
			out[byUUID[tr.UUID]] = append(out[byUUID[tr.UUID]], tr)
		}
		return out
	}
	refTr, gotTr := perDevice(ref), perDevice(got)
	show := func(trs []simulate.Transition) string {
		var s []string
		for _, tr := range trs {
			s = append(s, fmt.Sprintf("%s %s→%s %s", time.Duration(tr.At), tr.From, tr.To, tr.Reason))
		}
		return "[" + strings.Join(s, ", ") + "]"
	}
	for key := range refState {
		r, g := refTr[key], gotTr[key]
		same := len(r) == len(g)
		var apart time.Duration
		for i := 0; same && i < len(r); i++ {
			same = r[i].From == g[i].From && r[i].To == g[i].To &&
				(r[i].Reason == g[i].Reason || sameInstant(refState[key].since, g[i].Reason, time.Duration(r[i].At)))
			apart = max(apart, (time.Duration(r[i].At) - time.Duration(g[i].At)).Abs())
		}
		if same && apart > equivalenceSlack {
			same = false
		}
		if !same {
			msg := fmt.Sprintf("transitions %s vs %s", show(r), show(g))
			if differ[key] != "" {
				msg = differ[key] + "; " + msg
			}
			differ[key] = msg
			continue
		}
		worst = max(worst, apart)
	}
	return differ, worst
}

// sameInstant reports whether reason is a condition the reference also has, begun within
// equivalenceSlack of at: a transition to worse health names the worst condition that caused it,
// and of two equally bad conditions begun that close together (an event, and a reading polled in
// the same round) either backend may see either first.
func sameInstant(since map[string]time.Duration, reason string, at time.Duration) bool {
	s, ok := since[reason]
	return ok && (s-at).Abs() <= equivalenceSlack
}

// equivalenceChild replays the scenario in $GPUHEALTH_SIMDRIVER_SCENARIO through the NVML
// backend on the simulated driver, both in this process on one running clock, and prints the
// result as `gpuhealth simulate` does.
func equivalenceChild(root string) int {
	sc, err := sim.ParseDriverScenario([]byte(os.Getenv("GPUHEALTH_SIMDRIVER_SCENARIO")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	speed, err := strconv.ParseFloat(os.Getenv("GPUHEALTH_SIMDRIVER_SPEED"), 64)
	if err != nil || speed <= 0 {
		fmt.Fprintln(os.Stderr, "GPUHEALTH_SIMDRIVER_SPEED:", err)
		return 2
	}
	policy := health.DefaultPolicy()
	end := simulate.End(sc, policy, sim.DefaultSampleEvery)
	// The sim backend's first sampling round comes before the events at 0s; here the consumer
	// takes it while the clock stands still, and the events at 0s follow the moment it runs.
	for i := range sc.Events {
		if sc.Events[i].At <= 0 {
			sc.Events[i].At = time.Millisecond
		}
	}
	clk := newFastClock(speed, time.Unix(0, 0).UTC())
	logger := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})

	registered := make(chan int, 4096)
	ready := make(chan struct{})
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	served := make(chan error, 1)
	go func() {
		served <- simdriver.Serve(serveCtx, simdriver.Options{Scenario: sc, DriverRoot: root, LibraryDir: os.Getenv("GPUHEALTH_SIMDRIVER_LIBS"),
			Clock: clk, Logger: logger, Ready: func() { close(ready) },
			OnRegister: func(_ uint32, gpu int, _ uint64) {
				select {
				case registered <- gpu:
				default:
				}
			}})
	}()
	select {
	case <-ready:
	case err := <-served:
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	b, err := gpunvml.OpenDriverRoot(root, nil, gpunvml.WithClock(clk), gpunvml.WithSamplePeriod(sim.DefaultSampleEvery),
		gpunvml.WithEventWait(50*time.Millisecond), gpunvml.WithLogger(logger))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	rec, err := simulate.NewRecorder(policy, b.Devices(), sim.New(sc, sim.Options{}).BootID(), clk.epoch)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	ran := make(chan error, 1)
	go func() { ran <- b.Run(runCtx, rec) }()

	// Time runs once every GPU's events are watched and the first round is taken.
	seen := map[int]bool{}
	for deadline := time.Now().Add(30 * time.Second); len(seen) < sc.GPUCount || b.Stats().Rounds < 1; {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "the NVML backend watched %d of %d GPUs and took %d rounds in 30s\n", len(seen), sc.GPUCount, b.Stats().Rounds)
			return 1
		}
		select {
		case g := <-registered:
			seen[g] = true
		case <-time.After(5 * time.Millisecond):
		}
	}
	clk.start()
	// Half a round past the end, so that the round at the end is in, as in the reference.
	stopAt := clk.epoch.Add(end + sim.DefaultSampleEvery/2)
	for now := clk.Now(); now.Before(stopAt); now = clk.Now() {
		time.Sleep(clk.real(stopAt.Sub(now)) + time.Millisecond)
	}
	stopRun()
	if err := <-ran; err != nil {
		fmt.Fprintln(os.Stderr, "run:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "stats: %+v\n", b.Stats())
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close:", err)
	}
	stopServe()
	if err := <-served; err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		return 1
	}
	res, err := rec.Result(sc.Node, clk.epoch.Add(end))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out, err := json.Marshal(res)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(string(out))
	return 0
}
