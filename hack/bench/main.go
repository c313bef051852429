// Command bench measures every figure of docs/benchmarks.md and renders the document from them:
// `make bench`.
//
// Each figure is the median of several runs: the library benchmarks (go test -bench, -count 5,
// one core), the real `gpuhealth agent --backend sim` binary idle and under an XID storm (RSS and
// CPU from /proc), signal → API object latency and writes per change (TestBenchSignalToObject),
// the extender's filter at 5,000 nodes (its benchmark), and the fleet (test/fleet, GPUHEALTH_FLEET).
// Everything runs on loopback against control planes started by test/controlplane, one thing at
// a time, and everything started is stopped before the program exits.
//
// The work is split by job. The run_*.go files measure: each measuring test writes its figures as
// JSON lines (package figure), the library benchmarks' output is read as Go's benchmark format,
// and the agent's figures are taken here. collect.go gathers every figure, tagged with its part
// and run, with the machine and the knobs into results.json in the raw directory. render.go
// writes the table and the document from those results alone; -render does that again from a
// saved results.json without measuring anything.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// options are the command line: the knobs the document quotes, and where things go.
type options struct {
	settings
	gpuhealth string
	agent     string
	out       string
	skip      string
	render    string
	// testTimeout is go test's -timeout for a measuring test (default 20m).
	testTimeout time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.gpuhealth, "gpuhealth", "bin/gpuhealth", "the gpuhealth binary (make build)")
	flag.StringVar(&o.agent, "agent", "bin/gpuhealth-agent", "the agent binary the DaemonSet runs, whose memory the agent part measures (make build)")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "the document to write (empty: print the table only)")
	flag.StringVar(&o.Raw, "raw", "bin/bench", "directory for the raw outputs, logs and results.json")
	flag.StringVar(&o.render, "render", "", "render the document from this results.json of an earlier run instead of measuring")
	flag.IntVar(&o.Runs, "runs", 3, "runs of each agent and latency measurement")
	flag.DurationVar((*time.Duration)(&o.AgentWindow), "agent-window", 15*time.Second, "how long each agent run is measured")
	flag.IntVar(&o.StormRate, "storm-rate", 100000, "XIDs per second over the 8 GPUs in the storm scenario")
	flag.IntVar(&o.Faults, "faults", 200, "faults (each with its recovery) per latency run: the p99 of 200 is the third-slowest, steadier than of 100")
	flag.IntVar(&o.FleetNodes, "fleet-nodes", 500, "simulated nodes in the fleet")
	flag.IntVar(&o.FleetRuns, "fleet-runs", 3, "fleet runs")
	flag.DurationVar((*time.Duration)(&o.FleetSteady), "fleet-steady", 30*time.Second, "the fleet's steady-state window")
	flag.IntVar(&o.FleetLarge, "fleet-large", 5000, "nodes of one more fleet run, 5,000 × 8 GPUs by default: the size of the largest published GPU-health deployments (0: none)")
	flag.BoolVar(&o.FleetBreaker, "fleet-breaker", true, "one more fleet run with the circuit breaker on")
	flag.IntVar(&o.Scale, "fleet-50k", 0, "nodes of the fleet at scale (make bench-fleet-50k: 50000; 0: not run), its own part")
	flag.IntVar(&o.ScaleAgents, "fleet-50k-agents", 2000, "how many of the fleet at scale's nodes run a real agent (the rest are written as an agent writes them)")
	flag.DurationVar((*time.Duration)(&o.ScaleSteady), "fleet-50k-steady", 60*time.Second, "the fleet at scale's steady-state window")
	flag.DurationVar((*time.Duration)(&o.ScaleHeartbeat), "fleet-50k-heartbeat", 5*time.Minute, "agent.heartbeat in the fleet at scale (the default)")
	flag.IntVar(&o.ScaleFaults, "fleet-50k-faults", 40, "single faults timed one at a time in the fleet at scale")
	flag.StringVar(&o.skip, "skip", "", "comma-separated parts to leave out: "+strings.Join(partNames(), ","))
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// part is one measurement: what -skip calls it, and how it runs. Its figures carry its name
// (or, for the fleet's extra runs, a name that starts with it).
type part struct {
	name    string
	title   string
	measure func(context.Context, options) ([]figure.Figure, error)
}

// parts are the measurements in the order they run and appear in the table.
func parts() []part {
	return []part{
		{partLibrary, "library benchmarks", measureLibrary},
		{partAgent, "agent", measureAgent},
		{partContainer, "agent container", measureContainer},
		{partLatency, "signal -> object latency", measureLatency},
		{partFleet, "fleet", measureFleet},
		{partScale, "fleet at scale", measureScale},
	}
}

func partNames() []string {
	var names []string
	for _, p := range parts() {
		names = append(names, p.name)
	}
	return names
}

func run(ctx context.Context, o options) error {
	if o.render != "" {
		res, err := loadResults(o.render)
		if err != nil {
			return err
		}
		return publish(res, o.out)
	}
	skip := map[string]bool{}
	for _, s := range strings.Split(o.skip, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(partNames(), s) {
			return fmt.Errorf("-skip %s: no such part (parts: %s)", s, strings.Join(partNames(), ","))
		}
		skip[s] = true
	}
	if err := os.MkdirAll(o.Raw, 0o755); err != nil {
		return err
	}
	started := time.Now()
	machine, err := describeMachine(ctx)
	if err != nil {
		return err
	}
	res := results{Machine: machine, Settings: o.settings}
	for _, p := range parts() {
		if skip[p.name] {
			continue
		}
		figs, err := p.measure(ctx, o)
		if err != nil {
			return fmt.Errorf("%s: %w", p.title, err)
		}
		res.Figures = append(res.Figures, figs...)
		// Render what there is now, so that a missing figure stops the run here rather than
		// after the parts still to come; the raw outputs say what the test printed.
		if err := checkRender(res); err != nil {
			return fmt.Errorf("%s: %w (raw outputs in %s)", p.title, err, o.Raw)
		}
	}
	res.Took = duration(time.Since(started))
	path := filepath.Join(o.Raw, "results.json")
	if err := saveResults(path, res); err != nil {
		return err
	}
	progress("done in %s; figures in %s", time.Since(started).Round(time.Second), path)
	return publish(res, o.out)
}

// checkRender renders res as publish would, for its errors.
func checkRender(res results) error {
	if onlyScale(res) {
		_, _, err := renderScale(res)
		return err
	}
	_, _, err := render(res)
	return err
}

// publish renders res, prints the table and writes the document to out (unless out is empty).
// The fleet at scale is merged (mergeScale): a run of it alone replaces its rows and section in
// the document out holds and keeps the rest; a run without it keeps those of the document.
func publish(res results, out string) error {
	var old string
	if out != "" {
		if b, err := os.ReadFile(out); err == nil {
			old = string(b)
		}
	}
	hasScale := slices.ContainsFunc(res.Figures, func(f figure.Figure) bool { return f.Part == partScale })
	var scaleTable, section string
	var scale []row
	if hasScale {
		var err error
		if scale, section, err = renderScale(res); err != nil {
			return err
		}
		scaleTable = renderTable(scale)
	}
	var doc string
	if onlyScale(res) {
		if old == "" && out != "" {
			return fmt.Errorf("%s: no document to merge the fleet at scale into (run make bench first)", out)
		}
		fmt.Println()
		fmt.Println(scaleTable)
		doc = mergeScale(old, scale, section)
	} else {
		table, full, err := render(res)
		if err != nil {
			return err
		}
		fmt.Println()
		fmt.Println(table + strings.TrimPrefix(scaleTable, "| what | median | how |\n|---|---|---|\n"))
		if !hasScale {
			scale, section = keptScale(old)
		}
		doc = full
		if len(scale) > 0 || section != "" {
			doc = mergeScale(full, scale, section)
		}
	}
	if out == "" {
		return nil
	}
	return os.WriteFile(out, []byte(doc), 0o644)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
