package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// row is one line of the table.
type row struct{ what, figure, how string }

// render renders the table and the whole document from res alone. A figure the document needs
// and res lacks is an error, never a zero.
func render(res results) (table, doc string, err error) {
	if err := res.check(); err != nil {
		return "", "", err
	}
	l := &lookup{figs: res.Figures}
	var rows []row
	for _, p := range []struct {
		part string
		rows func(*lookup, settings) []row
	}{
		{partLibrary, libraryRows},
		{partAgent, agentRows},
		{partContainer, containerRows},
		{partLatency, latencyRows},
		{partFleet, fleetRows},
		{partFleetLarge, fleetLargeRows},
		{partFleetBreaker, fleetBreakerRows},
	} {
		if l.has(p.part) {
			rows = append(rows, p.rows(l, res.Settings)...)
		}
	}
	table = renderTable(rows)
	doc = renderDocument(l, res, table)
	if l.err != nil {
		return "", "", l.err
	}
	return table, doc, nil
}

// The library benchmarks the table quotes.
const (
	benchXIDStorm          = "BenchmarkXIDStorm/xid=13"
	benchMixedLoad         = "BenchmarkMixedLoad"
	benchRetained          = "BenchmarkStormRetainedMemory/signals=1000000"
	benchRetainedSmall     = "BenchmarkStormRetainedMemory/signals=1000"
	benchFilter            = "BenchmarkExtenderFilter"
	benchFilterNodeObjects = "BenchmarkExtenderFilterNodeObjects"
	benchFilterSlowClients = "BenchmarkExtenderFilterWithSlowClients"
	benchKmsgParse         = "BenchmarkParseMixedLog"
	benchKmsgReplay        = "BenchmarkReplayRingBuffer/buffer=1MiB/fresh"
	benchKmsgReplayRestart = "BenchmarkReplayRingBuffer/buffer=1MiB/restart"
	benchSimCall           = "BenchmarkCallRoundTrip"
	benchSimRound          = "BenchmarkSamplingRound64GPUs8Consumers"
)

func libraryRows(l *lookup, _ settings) []row {
	v := func(name, unit string) float64 { return l.median(partLibrary, name, unit) }
	how := fmt.Sprintf("go test -bench, median of %d, -cpu 1", len(l.all(partLibrary, benchMixedLoad, "ns/op")))
	rows := []row{
		{"library: XID storm (one GPU, one XID repeated)", fmt.Sprintf("%s signals/s, %.0f B and %.0f allocs per signal",
			millions(v(benchXIDStorm, "signals/s")), v(benchXIDStorm, "B/op"), v(benchXIDStorm, "allocs/op")), how},
		{"library: mixed load (every kind of signal, 8 GPUs)", fmt.Sprintf("%s signals/s, %.0f B and %.0f allocs per signal",
			millions(v(benchMixedLoad, "signals/s")), v(benchMixedLoad, "B/op"), v(benchMixedLoad, "allocs/op")), how},
		{"library: heap kept after 1,000,000 storm signals", fmt.Sprintf("%s (after 1,000: %s)",
			kib(v(benchRetained, "retained-B")), kib(v(benchRetainedSmall, "retained-B"))), how},
		{"kernel log: parse 1,000,000 mixed lines (1 in 10 NVRM)", fmt.Sprintf("%s lines/s, %.0f B and %.1f allocs per line",
			millions(v(benchKmsgParse, "lines/s")), v(benchKmsgParse, "B/line"), v(benchKmsgParse, "allocs/line")), how},
		{fmt.Sprintf("kernel log: start-up replay of a full 1 MiB buffer (%s records)", thousands(int(v(benchKmsgReplay, "records")))),
			fmt.Sprintf("%.0f ms at first start, %.0f ms after a restart (all applied before)",
				v(benchKmsgReplay, "ms/replay"), v(benchKmsgReplayRestart, "ms/replay")), how},
		{"extender: /filter, 5,000 nodes × 8 GPUs, nodeCacheCapable", fmt.Sprintf("p50 %.2f ms, p99 %.2f ms (%s; the runs' p99 %s ms); "+
			"CPU time per call p50 %.2f ms, p99 %.2f ms; %s and %.0f allocs per call",
			v(benchFilter, "p50-ms"), v(benchFilter, "p99-ms"), goal(v(benchFilter, "p99-ms"), filterGoalMs, "ms"),
			spread(l.all(partLibrary, benchFilter, "p99-ms"), "%.2f", 1), v(benchFilter, "p50-cpu-ms"), v(benchFilter, "p99-cpu-ms"),
			kib(v(benchFilter, "B/op")), v(benchFilter, "allocs/op")), how},
		{"extender: /filter, 5,000 Node objects in the request", fmt.Sprintf("p50 %.0f ms, p99 %.0f ms",
			v(benchFilterNodeObjects, "p50-ms"), v(benchFilterNodeObjects, "p99-ms")), how},
	}
	// Results from before the benchmark existed lack it.
	if l.hasFigure(partLibrary, benchFilterSlowClients) {
		rows = append(rows, slowClientsRow(l, how))
	}
	return append(rows, []row{
		{"simulated driver: one library call's round trip to the simulator", fmt.Sprintf("p50 %.1f µs, p99 %.1f µs (%s; the runs' p99 %s µs)",
			v(benchSimCall, "p50-us"), v(benchSimCall, "p99-us"), goal(v(benchSimCall, "p99-us"), simCallGoalUs, "µs"),
			spread(l.all(partLibrary, benchSimCall, "p99-us"), "%.1f", 1)), how},
		{"simulated driver: 64 GPUs sampled by 8 consumers every 10 s", fmt.Sprintf("%.2f%% of a core (%.0f ms CPU per round of %s calls, simulator and consumers together; %s)",
			v(benchSimRound, "core-%-at-10s"), v(benchSimRound, "cpu-ms/round"), thousands(int(v(benchSimRound, "calls/round"))),
			goal(v(benchSimRound, "core-%-at-10s"), simCoreGoalPct, "%")), how},
	}...)
}

// slowClientsRow is BenchmarkExtenderFilterWithSlowClients: the well-behaved /filter p99 with
// slow clients against the same run's p99 without them, and the heap meanwhile.
func slowClientsRow(l *lookup, how string) row {
	v := func(unit string) float64 { return l.median(partLibrary, benchFilterSlowClients, unit) }
	return row{"extender: /filter over loopback while 8 slow clients trickle 8 MiB bodies", fmt.Sprintf(
		"p99 %.2f ms with them, %.2f ms without in the same runs: ratio %.2f× (goal ≤ %g×; the runs' ratios %s); "+
			"Go heap with them at its peak %.0f MiB (%s), live %.0f MiB (without them %.0f and %.0f MiB); "+
			"per run %.0f slow requests, %.0f refused, %.0f cut",
		v("slow-p99-ms"), v("p99-ms"), v("p99-ratio"), slowClientsGoalRatio, spread(l.all(partLibrary, benchFilterSlowClients, "p99-ratio"), "%.2f", 1),
		v("slow-heap-MiB"), goal(v("slow-heap-MiB"), extenderMemLimitMiB, "MiB"), v("slow-live-heap-MiB"), v("heap-MiB"), v("live-heap-MiB"),
		v("slow-requests"), v("slow-refused"), v("slow-cut")), how}
}

// The goals the table measures against: issue 18's, unless another issue is named.
const (
	filterGoalMs     = 2  // extender /filter p99 at 5,000 nodes
	agentIdleGoalMiB = 30 // agent idle RSS with 8 GPUs
	agentAnonGoalMiB = 10 // of which anonymous
	simCallGoalUs    = 20 // issue 27: a simulated-driver call's round trip p99
	simCoreGoalPct   = 1  // issue 27: 64 GPUs to 8 consumers at the default sampling
	// issue 28: the well-behaved /filter p99 with 8 slow clients ÷ without, in the same run
	slowClientsGoalRatio = 1.5
	// the chart's extender.resources.limits.memory, which the slow clients' heap must stay under
	extenderMemLimitMiB = 512
	// issue 28: the heartbeat's cost at steady state
	heartbeatGoalPerNodePerPeriod = 1.0
)

// spread is the lowest and the highest value of figs (each times scale): "1.2–3.4".
func spread(figs []figure.Figure, format string, scale float64) string {
	v := collect(figs, func(f figure.Figure) float64 { return f.Value * scale })
	if len(v) == 0 {
		return "?"
	}
	return fmt.Sprintf(format+"–"+format, slices.Min(v), slices.Max(v))
}

// goal says how a figure compares with its goal: "goal ≤ 2 ms: 0.9×".
func goal(v, limit float64, unit string) string {
	return fmt.Sprintf("goal ≤ %g %s: %.2f×", limit, unit, v/limit)
}

func agentRows(l *lookup, s settings) []row {
	how := fmt.Sprintf("`gpuhealth-agent --backend sim`, /proc/PID, %s window, median of %d", s.AgentWindow, len(l.runs(partAgent)))
	var rows []row
	for _, kind := range []string{scenarioIdle, scenarioStorm} {
		v := func(name, unit string) float64 { return l.median(partAgent, name, unit, labelScenario, kind) }
		mib := func(name string) float64 { return v(name, figure.UnitKiB) / 1024 }
		what := "agent: idle, 8 simulated GPUs (sampling every 10 s)"
		if kind == scenarioStorm {
			what = fmt.Sprintf("agent: XID storm, 8 simulated GPUs, %s XIDs/s evaluated (gpuhealth_xid_total)", thousands(int(v(agentXIDRate, unitXIDRate))))
		}
		var rssGoal, anonGoal string
		if kind == scenarioIdle {
			rssGoal, anonGoal = ", "+goal(mib(agentRSS), agentIdleGoalMiB, "MiB"), ", "+goal(mib(agentRSSAnon), agentAnonGoalMiB, "MiB")
		}
		rows = append(rows, row{what, fmt.Sprintf("RSS %.1f MiB%s (anonymous %.1f%s; file-backed %.1f; peak %.1f); Go heap %.1f MiB; CPU %.1f%% of a core; "+
			"the runs' RSS %s MiB; binary %.1f MiB",
			mib(agentRSS), rssGoal, mib(agentRSSAnon), anonGoal, mib(agentRSSFile), mib(agentRSSPeak), mib(agentGoHeap), v(agentCPU, figure.UnitCPU),
			spread(l.all(partAgent, agentRSS, figure.UnitKiB, labelScenario, kind), "%.1f", 1.0/1024), mib(agentBinary)), how})
	}
	return rows
}

func containerRows(l *lookup, s settings) []row {
	how := fmt.Sprintf("TestBenchAgentContainerMemory: the chart's agent pod on a containerd node; kubelet /stats/summary, the container's cgroup, /proc/PID; %s window, median of %d",
		s.AgentWindow, len(l.runs(partContainer)))
	var rows []row
	for _, kind := range []string{figure.ScenarioIdle, figure.ScenarioStorm} {
		mib := func(name string) float64 {
			return l.median(partContainer, name, figure.UnitKiB, figure.LabelScenario, kind) / 1024
		}
		what := "agent in a container: idle, 8 simulated GPUs, as the kubelet and cgroup see it"
		var wsGoal string
		if kind == figure.ScenarioIdle {
			wsGoal = ", " + goal(mib(figure.ContainerWorkingSet), agentIdleGoalMiB, "MiB")
		} else {
			what = "agent in a container: XID storm, as the kubelet and cgroup see it"
		}
		rows = append(rows, row{what, fmt.Sprintf("kubelet working set %.1f MiB%s (rss %.1f, usage %.1f); cgroup usage %.1f MiB (anonymous %.1f, page cache %.1f; peak %.1f); "+
			"the agent's /proc RSS %.1f MiB (anonymous %.1f, file-backed %.1f); CPU %.1f%% of a core; the runs' working set %s MiB",
			mib(figure.ContainerWorkingSet), wsGoal, mib(figure.ContainerRSS), mib(figure.ContainerUsage),
			mib(figure.CgroupUsage), mib(figure.CgroupAnon), mib(figure.CgroupFile), mib(figure.CgroupPeak),
			mib(figure.ContainerProcRSS), mib(figure.ContainerProcAnon), mib(figure.ContainerProcFile),
			l.median(partContainer, figure.ContainerCPU, figure.UnitCPU, figure.LabelScenario, kind),
			spread(l.all(partContainer, figure.ContainerWorkingSet, figure.UnitKiB, figure.LabelScenario, kind), "%.1f", 1.0/1024)), how})
	}
	return rows
}

// runRatios is the lowest and highest of the runs' agent ÷ bare client ratios at percentile q on
// path p: how far one run's ratio strays from the median.
func runRatios(l *lookup, p, q string) string {
	var ratios []float64
	for _, run := range l.runs(partLatency) {
		agent, bare := l.one(partLatency, run, figure.SignalToObject, figure.UnitMilliseconds, figure.LabelPath, p), l.one(partLatency, run, figure.BareClientToObject, figure.UnitMilliseconds, figure.LabelPath, p)
		a, errA := agent.Percentile(q)
		b, errB := bare.Percentile(q)
		if errA != nil || errB != nil || b == 0 {
			l.fail(fmt.Errorf("run %s of %s: no %s of the agent or the bare client", run, p, q))
			return "?"
		}
		ratios = append(ratios, a/b)
	}
	if len(ratios) == 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f–%.2f", slices.Min(ratios), slices.Max(ratios))
}

func latencyRows(l *lookup, s settings) []row {
	how := fmt.Sprintf("TestBenchSignalToObject, %d faults + %d recoveries per run, median of %d runs' percentiles", s.Faults, s.Faults, len(l.runs(partLatency)))
	var rows []row
	for _, p := range l.labelValues(partLatency, figure.SignalToObject, figure.LabelPath) {
		pct := func(q string) float64 {
			return l.medianPercentile(q, partLatency, figure.SignalToObject, figure.UnitMilliseconds, figure.LabelPath, p)
		}
		fig := fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", pct(figure.P50), pct(figure.P99))
		// Runs since the bare client was added also measure the limit, in the same run.
		if l.hasFigure(partLatency, figure.BareClientToObject) {
			bare := func(q string) float64 {
				return l.medianPercentile(q, partLatency, figure.BareClientToObject, figure.UnitMilliseconds, figure.LabelPath, p)
			}
			fig += fmt.Sprintf("; bare client p50 %.1f ms, p99 %.1f ms; ratio %.2f× / %.2f× (the runs' ratios p50 %s, p99 %s)",
				bare(figure.P50), bare(figure.P99), pct(figure.P50)/bare(figure.P50), pct(figure.P99)/bare(figure.P99),
				runRatios(l, p, figure.P50), runRatios(l, p, figure.P99))
		}
		rows = append(rows, row{"signal → object: " + p, fig, how})
	}
	if l.hasFigure(partLatency, figure.SignalTrace) {
		for _, p := range l.labelValues(partLatency, figure.SignalTrace, figure.LabelPath) {
			var stages []string
			for _, stage := range l.labelValues(partLatency, figure.SignalTrace, figure.LabelStage) {
				stages = append(stages, fmt.Sprintf("%s %.2f ms", stage, l.medianPercentile(figure.P50, partLatency, figure.SignalTrace, figure.UnitMilliseconds,
					figure.LabelPath, p, figure.LabelStage, stage)))
			}
			rows = append(rows, row{"trace, p50 of each stage: " + p, strings.Join(stages, ", "), how + "; the agent's requests timed by its client's transport"})
		}
	}
	var w []string
	for _, sink := range l.labelValues(partLatency, figure.WritesPerChange, figure.LabelSink) {
		w = append(w, fmt.Sprintf("%s %.2f", sink, l.median(partLatency, figure.WritesPerChange, figure.UnitWritesPerChange, figure.LabelSink, sink)))
	}
	return append(rows, row{"API writes per GPU state change, by sink", strings.Join(w, ", "), how})
}

func fleetRows(l *lookup, _ settings) []row {
	v := func(name, unit string) float64 { return l.median(partFleet, name, unit) }
	how := fmt.Sprintf("test/fleet, one process, own client per node, median of %d", len(l.runs(partFleet)))
	rows := []row{
		{fmt.Sprintf("fleet: %.0f nodes × 8 GPUs, start-up until every agent is ready", v(figure.FleetNodes, figure.UnitNodes)),
			fmt.Sprintf("%.1f s, %.0f requests", v(figure.FleetStartupTime, figure.UnitSeconds), v(figure.FleetStartupRequests, figure.UnitRequests)), how},
		{"fleet: agent memory per node (in one process)",
			fmt.Sprintf("heap %.0f KiB, RSS %.0f KiB, %.0f goroutines, %.0f watches", v(figure.FleetHeapPerNode, figure.UnitKiB),
				v(figure.FleetRSSPerNode, figure.UnitKiB), v(figure.FleetGoroutinesPerNode, figure.UnitGoroutines),
				v(figure.FleetWatchesPerNode, figure.UnitWatches)), how},
		{fmt.Sprintf("fleet: API requests at steady state (%.0f s, resync 1 h)", v(figure.FleetSteadyWindow, figure.UnitSeconds)),
			fmt.Sprintf("%.2f requests/s for the whole fleet, %.0f writes; agents' CPU %.1f%% of a core",
				v(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond), v(figure.FleetSteadyWrites, figure.UnitWrites),
				v(figure.FleetSteadyCPU, figure.UnitCPU)), how},
		{fmt.Sprintf("fleet: 10%% of GPUs fail at once (%.0f GPUs on %.0f nodes)", v(figure.FleetWaveGPUs, figure.UnitGPUs), v(figure.FleetWaveNodes, figure.UnitNodes)),
			fmt.Sprintf("all taints and annotations in %.1f s (rules %.1f s, annotations %.1f s; per object p50 %.2f s, p99 %.1f s); %.0f requests",
				v(figure.FleetWaveAllTime, figure.UnitSeconds), v(figure.FleetWaveRulesTime, figure.UnitSeconds),
				v(figure.FleetWaveAnnotationsTime, figure.UnitSeconds),
				l.medianPercentile(figure.P50, partFleet, figure.FleetWaveObjectLatency, figure.UnitSeconds),
				l.medianPercentile(figure.P99, partFleet, figure.FleetWaveObjectLatency, figure.UnitSeconds),
				v(figure.FleetWaveRequests, figure.UnitRequests)) + bareWave(l, partFleet), how},
	}
	return append(rows, heartbeatRows(l, partFleet, how)...)
}

// heartbeatRows is the row of the fleet's heartbeat phase (issue 28), when part's runs had one:
// results from before it, or from runs without it, have no row.
func heartbeatRows(l *lookup, part, how string) []row {
	if !l.hasFigure(part, figure.FleetHeartbeatPerNodePerPeriod) {
		return nil
	}
	v := func(name, unit string) float64 { return l.median(part, name, unit) }
	nodes, ratio := v(figure.FleetNodes, figure.UnitNodes), v(figure.FleetHeartbeatPerNodePerPeriod, figure.UnitWritesPerNodePerPeriod)
	return []row{{
		fmt.Sprintf("fleet: heartbeat, %.0f nodes (agent.heartbeat %.0f s, %.0f s of steady state)", nodes,
			v(figure.FleetHeartbeatPeriod, figure.UnitSeconds), v(figure.FleetHeartbeatWindow, figure.UnitSeconds)),
		fmt.Sprintf("%.2f writes per node per period (goal ≤ %g write per node per period: %.2f×); %.0f writes (%s), %.0f requests (%s); "+
			"at the default %g min, %.1f writes/s for the whole fleet",
			ratio, heartbeatGoalPerNodePerPeriod, ratio/heartbeatGoalPerNodePerPeriod,
			v(figure.FleetHeartbeatWrites, figure.UnitWrites), byKind(medianBy(l.all(part, figure.FleetHeartbeatWrites, figure.UnitWrites))),
			v(figure.FleetHeartbeatRequests, figure.UnitRequests), byKind(medianBy(l.all(part, figure.FleetHeartbeatRequests, figure.UnitRequests))),
			config.DefaultHeartbeat.Minutes(), nodes/config.DefaultHeartbeat.Seconds()*ratio),
		how + "; every agent started again over one period, then counted",
	}}
}

// medianBy is the median of every key of the figures' By over the figures (a key a figure lacks
// counts 0 there).
func medianBy(figs []figure.Figure) map[string]float64 {
	out := map[string]float64{}
	for _, f := range figs {
		for k := range f.By {
			if _, ok := out[k]; !ok {
				out[k] = median(collect(figs, func(f figure.Figure) float64 { return f.By[k] }))
			}
		}
	}
	return out
}

// bareWave is the wave's limit measured in the same runs, when they measured it: the same writes
// sent by bare clients, and the ratio.
func bareWave(l *lookup, part string) string {
	if !l.hasFigure(part, figure.FleetBareWaveAllTime) {
		return ""
	}
	bare, agents := l.median(part, figure.FleetBareWaveAllTime, figure.UnitSeconds), l.median(part, figure.FleetWaveAllTime, figure.UnitSeconds)
	return fmt.Sprintf("; bare clients sending the same writes: %.1f s, %.0f requests; ratio %.2f×",
		bare, l.median(part, figure.FleetBareWaveRequests, figure.UnitRequests), agents/bare)
}

func fleetLargeRows(l *lookup, _ settings) []row {
	v := func(name, unit string) float64 { return l.median(partFleetLarge, name, unit) }
	rows := []row{{
		fmt.Sprintf("fleet: %.0f nodes × 8 GPUs (%.0f GPUs fail at once)", v(figure.FleetNodes, figure.UnitNodes), v(figure.FleetWaveGPUs, figure.UnitGPUs)),
		fmt.Sprintf("start-up %.1f s; steady %.2f requests/s; wave: all taints and annotations in %.1f s (p99 %.1f s), %.0f requests",
			v(figure.FleetStartupTime, figure.UnitSeconds), v(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond),
			v(figure.FleetWaveAllTime, figure.UnitSeconds), l.medianPercentile(figure.P99, partFleetLarge, figure.FleetWaveObjectLatency, figure.UnitSeconds),
			v(figure.FleetWaveRequests, figure.UnitRequests)) + bareWave(l, partFleetLarge) +
			fmt.Sprintf("; memory per node: heap %.0f KiB, RSS %.0f KiB", v(figure.FleetHeapPerNode, figure.UnitKiB), v(figure.FleetRSSPerNode, figure.UnitKiB)),
		"test/fleet, one run",
	}}
	return append(rows, heartbeatRows(l, partFleetLarge, "test/fleet, one run")...)
}

func fleetBreakerRows(l *lookup, _ settings) []row {
	v := func(name, unit string) float64 { return l.median(partFleetBreaker, name, unit) }
	budget := v(figure.FleetBreakerBudget, figure.UnitGPUs)
	return []row{{
		fmt.Sprintf("fleet: %.0f nodes, circuit breaker on, budget 5%% (%.0f GPUs) against the 10%% wave", v(figure.FleetNodes, figure.UnitNodes), budget),
		fmt.Sprintf("all taints and annotations in %.1f s; exactly %.0f GPUs NoSchedule after %.1f s, never more than %.0f at once, the rest None; %.0f requests; heap %.0f KiB per node",
			v(figure.FleetWaveAllTime, figure.UnitSeconds), budget, v(figure.FleetBreakerSettleTime, figure.UnitSeconds),
			v(figure.FleetBreakerMaxDisruptive, figure.UnitGPUs), v(figure.FleetWaveRequests, figure.UnitRequests), v(figure.FleetHeapPerNode, figure.UnitKiB)),
		"test/fleet GPUHEALTH_FLEET_BREAKER=1, one run",
	}}
}

func renderTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| what | median | how |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.what, r.figure, r.how)
	}
	return b.String()
}

// renderDocument writes docs/benchmarks.md around table; figures it cannot find go to l.err.
func renderDocument(l *lookup, res results, table string) string {
	m, s := res.Machine, res.Settings
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by `make bench` (hack/bench); every figure below comes from that one command. Rerun it to\n" +
		"refresh this page; figures from another machine belong on another page.\n\n")
	fmt.Fprintf(&b, "Measured %s on %d CPUs (`nproc`) of %s, %.1f GiB memory, Linux %s, %s.\n"+
		"The machine was shared with other work while it ran, so treat small differences as noise. `make bench` took %s.\n\n",
		m.Date.Format("2006-01-02 15:04 MST"), m.CPUs, cmp.Or(m.CPUModel, "an unknown CPU"), m.MemGiB, m.Kernel, m.GoVersion,
		time.Duration(res.Took).Round(time.Second))
	b.WriteString(table)
	b.WriteString(whatEachFigureIs)
	b.WriteString(fleetRuns(l))
	fmt.Fprintf(&b, "\n## Knobs\n\n`go run ./hack/bench -h`: runs (%d), agent window (%s), storm rate (%s XIDs/s), faults per latency run (%d), fleet nodes (%d), fleet runs (%d), fleet steady window (%s), the larger fleet run (%d nodes, `-fleet-large 0` skips it), the run with the circuit breaker (`-fleet-breaker=false` skips it), the fleet at scale (`-fleet-50k` nodes, 0 by default: `make bench-fleet-50k` runs 50,000, with `-fleet-50k-agents` real agents; its rows and section are merged into the document, and a run without it keeps them); `-skip %s` leaves parts out. Raw outputs and logs go to `%s/`.\n",
		s.Runs, s.AgentWindow, thousands(s.StormRate), s.Faults, s.FleetNodes, s.FleetRuns, s.FleetSteady, s.FleetLarge, strings.Join(partNames(), ","), s.Raw)
	return b.String()
}

// fleetRuns is the table of every fleet run, the larger one and the one with the breaker last,
// and what the first run's start-up requested; empty without fleet figures.
func fleetRuns(l *lookup) string {
	var b strings.Builder
	first := ""
	n := 0
	for _, part := range []string{partFleet, partFleetLarge, partFleetBreaker} {
		for _, run := range l.runs(part) {
			if n == 0 {
				b.WriteString("\n## The fleet's runs\n\n")
				b.WriteString("| run | nodes | start-up | steady requests/s (by kind) | wave: all written | wave requests (by kind, failed ones again by status) |\n|---|---|---|---|---|---|\n")
				first = byKind(l.one(part, run, figure.FleetStartupRequests, figure.UnitRequests).By)
			}
			n++
			label := fmt.Sprint(n)
			if part == partFleetBreaker {
				label += " (breaker)"
			}
			v := func(name, unit string) figure.Figure { return l.one(part, run, name, unit) }
			startup := v(figure.FleetStartupRequests, figure.UnitRequests)
			steady := v(figure.FleetSteadyRequests, figure.UnitRequests)
			wave := v(figure.FleetWaveRequests, figure.UnitRequests)
			fmt.Fprintf(&b, "| %s | %.0f | %.1f s, %.0f requests | %.2f (%s) | %.2f s | %.0f (%s) |\n", label,
				v(figure.FleetNodes, figure.UnitNodes).Value, v(figure.FleetStartupTime, figure.UnitSeconds).Value, startup.Value,
				v(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond).Value, byKind(steady.By),
				v(figure.FleetWaveAllTime, figure.UnitSeconds).Value, wave.Value, byKind(wave.By))
		}
	}
	if n > 0 {
		fmt.Fprintf(&b, "\nStart-up requests of run 1 by kind: %s.\n", first)
	}
	return b.String()
}
