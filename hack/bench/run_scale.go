package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
)

// The fleet at scale (issue 49, `make bench-fleet-50k`): one test/fleet run of -fleet-50k nodes,
// of which -fleet-50k-agents run a real agent and the rest are written as an agent writes them,
// with single faults, the wave, the bare clients' limits and the readers (extender, breaker
// counter, `gpuhealth status`). It is not part of `make bench` (0 nodes by default): it takes
// about half an hour. Its rows and its section replace those of an earlier scale run in the
// document and leave everything else as it was (mergeScale), and a `make bench` that did not run
// it keeps them.

// scaleRowPrefix starts the "what" of every row of the scale part; scaleBegin and scaleEnd
// bracket its section.
const (
	scaleRowPrefix = "fleet at scale"
	scaleBegin     = "<!-- fleet-50k: written by make bench-fleet-50k -->"
	scaleEnd       = "<!-- /fleet-50k -->"
)

// NVSentinel's published time to cordon at 50,000 nodes (its scale report), quoted beside ours.
const nvsentinelCordon = "p50 26 ms / p90 48 ms / p99 165 ms"

func measureScale(ctx context.Context, o options) ([]figure.Figure, error) {
	if o.Scale == 0 {
		return nil, nil
	}
	progress("fleet at scale: one run × %d nodes × 8 GPUs, %d of them with a real agent (test/fleet)", o.Scale, o.ScaleAgents)
	o.testTimeout = 80 * time.Minute
	waveNodes := o.Scale * 8 / 10 // one GPU in ten, at most one per node: 8 in 10 nodes change
	return fleetRun(ctx, o, o.Scale, partScale, "1",
		"GPUHEALTH_FLEET_AGENTS="+strconv.Itoa(o.ScaleAgents),
		"GPUHEALTH_FLEET_STEADY="+o.ScaleSteady.String(),
		"GPUHEALTH_FLEET_AGENT_HEARTBEAT="+o.ScaleHeartbeat.String(),
		"GPUHEALTH_FLEET_FAULTS="+strconv.Itoa(o.ScaleFaults),
		// The chart's rule: four queued requests per node that changes at once.
		"GPUHEALTH_FLEET_FLOW_QUEUE="+strconv.Itoa(max(20000, 4*waveNodes)),
		"GPUHEALTH_FLEET_READERS=1",
		"GPUHEALTH_FLEET_GPUHEALTH="+absPath(o.gpuhealth),
		"GPUHEALTH_FLEET_HEARTBEAT=0", // the heartbeat phase restarts every agent; the steady window has the Leases
	)
}

// scaleRows are the scale run's rows: each figure beside the limit measured in the same run.
func scaleRows(l *lookup, _ settings) []row {
	const p = partScale
	v := func(name, unit string) float64 { return l.median(p, name, unit) }
	pct := func(name string) (p50, p90, p99 float64) {
		return l.medianPercentile(figure.P50, p, name, figure.UnitSeconds), l.medianPercentile(figure.P90, p, name, figure.UnitSeconds),
			l.medianPercentile(figure.P99, p, name, figure.UnitSeconds)
	}
	taint := func(agents, bare string) string {
		a50, a90, a99 := pct(agents)
		b50, b90, b99 := pct(bare)
		return fmt.Sprintf("p50 %s, p90 %s, p99 %s; bare clients sending the same writes p50 %s, p90 %s, p99 %s; ratio %.2f× / %.2f× / %.2f×",
			dur(a50), dur(a90), dur(a99), dur(b50), dur(b90), dur(b99), a50/b50, a90/b90, a99/b99)
	}
	nodes, agents := v(figure.FleetNodes, figure.UnitNodes), v(figure.FleetAgents, figure.UnitNodes)
	how := fmt.Sprintf("test/fleet, one run: %s nodes, %s with a real agent, the rest written as an agent writes them", thousands(int(nodes)), thousands(int(agents)))
	waveGPUs := v(figure.FleetWaveGPUs, figure.UnitGPUs)
	bareAll, agentsAll := v(figure.FleetBareWaveAllTime, figure.UnitSeconds), v(figure.FleetWaveAllTime, figure.UnitSeconds)
	steady := l.all(p, figure.FleetSteadyRequests, figure.UnitRequests)
	wave := l.all(p, figure.FleetWaveRequests, figure.UnitRequests)
	var steadyBy, waveBy map[string]float64
	if len(steady) > 0 && len(wave) > 0 {
		steadyBy, waveBy = steady[0].By, wave[0].By
	}
	f50, f90, f99 := pct(figure.FleetFilter)
	return []row{
		{fmt.Sprintf("%s: %s nodes × 8 GPUs, %s real agents", scaleRowPrefix, thousands(int(nodes)), thousands(int(agents))),
			fmt.Sprintf("setup %.0f s (Nodes, ResourceSlices, the simulated nodes' start-up writes and Leases); the real agents ready %.1f s after their start; per real agent heap %.0f KiB, RSS %.0f KiB",
				v(figure.FleetSetupTime, figure.UnitSeconds), v(figure.FleetStartupTime, figure.UnitSeconds), v(figure.FleetHeapPerNode, figure.UnitKiB), v(figure.FleetRSSPerNode, figure.UnitKiB)), how},
		{fmt.Sprintf("%s: time to taint, %.0f single faults one at a time under steady load (signal → DeviceTaintRule and volcano.sh/gpu-unhealthy-ids seen)", scaleRowPrefix,
			float64(l.sampleCount(p, figure.FleetFaultTaint))),
			taint(figure.FleetFaultTaint, figure.FleetBareFaultTaint), how + "; faults on real agents; NVSentinel's time to cordon (another action) in the section below"},
		{fmt.Sprintf("%s: time to taint, 10%% wave (%s GPUs on %s nodes at once)", scaleRowPrefix, thousands(int(waveGPUs)), thousands(int(v(figure.FleetWaveNodes, figure.UnitNodes)))),
			taint(figure.FleetWaveTaint, figure.FleetBareWaveTaint) + fmt.Sprintf("; all written in %.1f s against %.1f s (%.2f×)", agentsAll, bareAll, agentsAll/bareAll), how},
		{fmt.Sprintf("%s: API traffic at steady state (%.0f s; agent.heartbeat %s)", scaleRowPrefix, v(figure.FleetSteadyWindow, figure.UnitSeconds),
			time.Duration(v(figure.FleetAgentHeartbeat, figure.UnitSeconds)*float64(time.Second))),
			fmt.Sprintf("%.1f requests/s (%s), %.1f KiB/s of bodies; %.0f Node writes", v(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond), byKind(steadyBy),
				v(figure.FleetSteadyByteRate, figure.UnitBytesPerSecond)/1024, v(figure.FleetSteadyWrites, figure.UnitWrites)), how + "; every client's requests, bodies sent and received (watches included)"},
		{fmt.Sprintf("%s: API traffic during the wave (%.0f s from the signal until counted)", scaleRowPrefix, v(figure.FleetWaveWindow, figure.UnitSeconds)),
			fmt.Sprintf("%.0f requests/s, %.1f MiB/s of bodies; %.0f requests (%s)", v(figure.FleetWaveRequestRate, figure.UnitRequestsPerSecond),
				v(figure.FleetWaveByteRate, figure.UnitBytesPerSecond)/(1<<20), v(figure.FleetWaveRequests, figure.UnitRequests), byKind(waveBy)), how},
		{fmt.Sprintf("%s: kube-apiserver and etcd memory", scaleRowPrefix),
			fmt.Sprintf("kube-apiserver RSS %.0f MiB at steady state, peak %.0f MiB; etcd %.0f MiB, peak %.0f MiB",
				v(figure.FleetAPIServerRSS, figure.UnitMiB), v(figure.FleetAPIServerPeakRSS, figure.UnitMiB), v(figure.FleetEtcdRSS, figure.UnitMiB), v(figure.FleetEtcdPeakRSS, figure.UnitMiB)),
			how + "; VmRSS and VmHWM from /proc of their processes"},
		{fmt.Sprintf("%s: extender /filter with %s nodes in its cache (4-GPU pod, nodeCacheCapable)", scaleRowPrefix, thousands(int(nodes))),
			fmt.Sprintf("p50 %s, p90 %s, p99 %s (goal at 5,000 nodes ≤ %d ms: %.2f×); caches synced in %.1f s; its share of the process: heap %.0f MiB, RSS %.0f MiB",
				dur(f50), dur(f90), dur(f99), filterGoalMs, f99*1000/filterGoalMs, v(figure.FleetExtenderSync, figure.UnitSeconds), v(figure.FleetExtenderHeap, figure.UnitMiB), v(figure.FleetExtenderRSS, figure.UnitMiB)),
			how + fmt.Sprintf("; in-process, %d calls one after another over loopback", l.sampleCount(p, figure.FleetFilter))},
		{fmt.Sprintf("%s: breaker controller's counter, recount from its start", scaleRowPrefix),
			fmt.Sprintf("the right count %.1f s after its start; heap %.0f MiB, RSS %.0f MiB", v(figure.FleetCounterRecount, figure.UnitSeconds), v(figure.FleetCounterHeap, figure.UnitMiB), v(figure.FleetCounterRSS, figure.UnitMiB)),
			how + "; internal/breaker Counter in-process, as after a failover"},
		{fmt.Sprintf("%s: `gpuhealth status -o json` over every node", scaleRowPrefix),
			statusFigure(v(figure.FleetStatusTime, figure.UnitSeconds), v(figure.FleetStatusPeakRSS, figure.UnitMiB), v(figure.FleetStatusUnfinished, figure.UnitCalls) > 0),
			how + "; the command as its own process (pages of 500), getrusage maxrss"},
	}
}

// scaleSection is the document's section on the scale run.
func scaleSection(l *lookup, res results) string {
	m := res.Machine
	var b strings.Builder
	b.WriteString(scaleBegin + "\n## The fleet at scale\n\n")
	fmt.Fprintf(&b, "The rows that start with *%s* come from `make bench-fleet-50k` (hack/bench `-fleet-50k`), one run, measured %s on %d CPUs of %s, %.1f GiB memory; it took %s. ",
		scaleRowPrefix, m.Date.Format("2006-01-02 15:04 MST"), m.CPUs, m.CPUModel, m.MemGiB, time.Duration(res.Took).Round(time.Second))
	b.WriteString(`Only some nodes run a real agent in the test's process (each costs about 1 MiB there); the others are
written exactly as an agent writes them: created with the annotations and conditions a real agent wrote at
start-up (copied, with the node's own name and GPU UUIDs), a heartbeat Lease renewed every agent.heartbeat with
heartbeat.Renewer's one write over a few shared connections, and, in the wave, the writes a real agent sent for a
fault on the GPU of the same index (copied from the single faults). The single faults go to real agents, one at a
time; each is timed from the signal until both its DeviceTaintRule and its ` + "`volcano.sh/gpu-unhealthy-ids`" + ` are seen
through watches, and then a bare client (the agents' identity and rate limits, no agent logic) sends the same
writes, timed the same way: the limit. The wave's limit is the bare wave; since most of the nodes that change
in it are simulated, sending copies of a real agent's writes, the wave's time is mostly the API server's, and
its ratio says that the copies and the bare clients' writes cost the same; the agents' own part at this size
shows in the single faults. The extender and the breaker's counter run in the test's process against the same
API server; their memory is what their caches added to it. ` + "`gpuhealth status`" + ` runs as its own process
with a time limit (` + "`GPUHEALTH_FLEET_STATUS_LIMIT`" + `, 3 minutes); one that runs over is stopped and shown
unfinished, with the time it had run. See [scale.md](scale.md) for the model these figures are set beside.

For comparison, NVIDIA's NVSentinel publishes its time to **cordon** at 50,000 nodes as ` + nvsentinelCordon + `.
That is a different action: a cordon marks the whole Node unschedulable, while gpuhealth taints the one
faulty GPU (a DeviceTaintRule, and the Volcano annotation) and the rest of the node stays usable; its
figures come from its own hardware and harness, not from this run.
` + scaleEnd + "\n")
	return b.String()
}

// mergeScale writes the scale part's rows and section into doc, an earlier document: its rows
// that start with scaleRowPrefix give way to rows, which go at the end of its first table, and
// everything else stays as it was; the section between scaleBegin and scaleEnd is replaced, or
// goes before "## Knobs".
func mergeScale(doc string, rows []row, section string) string {
	var lines []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "| "+scaleRowPrefix) {
			lines = append(lines, line)
		}
	}
	end := slices.IndexFunc(lines, func(line string) bool { return strings.HasPrefix(line, "| what |") })
	if end < 0 {
		end = len(lines)
	}
	for end < len(lines) && strings.HasPrefix(lines[end], "|") { // the header, |---|, the rows
		end++
	}
	var table []string
	for _, r := range rows {
		table = append(table, fmt.Sprintf("| %s | %s | %s |", r.what, r.figure, r.how))
	}
	doc = strings.Join(slices.Insert(lines, end, table...), "\n")
	if section == "" {
		return doc
	}
	if b, e := strings.Index(doc, scaleBegin), strings.Index(doc, scaleEnd); b >= 0 && e > b {
		return doc[:b] + section + strings.TrimPrefix(doc[e+len(scaleEnd):], "\n")
	}
	if k := strings.Index(doc, "## Knobs"); k >= 0 {
		return doc[:k] + section + "\n" + doc[k:]
	}
	return doc + "\n" + section
}

// keptScale returns the scale rows and section of an earlier document, to carry into a document
// rendered without them.
func keptScale(doc string) (rows []row, section string) {
	for line := range strings.Lines(doc) {
		line = strings.TrimSuffix(line, "\n")
		if !strings.HasPrefix(line, "| "+scaleRowPrefix) {
			continue
		}
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
		if len(cells) == 3 {
			rows = append(rows, row{cells[0], cells[1], cells[2]})
		}
	}
	if b, e := strings.Index(doc, scaleBegin), strings.Index(doc, scaleEnd); b >= 0 && e > b {
		section = doc[b:e+len(scaleEnd)] + "\n"
	}
	return rows, section
}

// onlyScale reports whether res holds the scale part's figures and nothing else.
func onlyScale(res results) bool {
	if len(res.Figures) == 0 {
		return false
	}
	for _, f := range res.Figures {
		if f.Part != partScale {
			return false
		}
	}
	return true
}

// renderScale renders the scale part's rows and section alone.
func renderScale(res results) ([]row, string, error) {
	l := &lookup{figs: res.Figures}
	rows := scaleRows(l, res.Settings)
	section := scaleSection(l, res)
	return rows, section, l.err
}

// statusFigure is the status row's figure: its time and peak RSS, or that it was stopped.
func statusFigure(seconds, rss float64, unfinished bool) string {
	if unfinished {
		return fmt.Sprintf("**unfinished**: stopped after %.0f s (peak RSS %.0f MiB by then); see scale.md", seconds, rss)
	}
	return fmt.Sprintf("%.1f s, peak RSS %.0f MiB", seconds, rss)
}

// dur writes seconds as ms below a second.
func dur(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.1f ms", s*1000)
	}
	return fmt.Sprintf("%.2f s", s)
}
