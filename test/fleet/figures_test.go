//go:build e2e

package fleet

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// What a run measured, and how hack/bench reads it.

// Figures are what one fleet run measured; GPUHEALTH_FLEET_OUT receives them as JSON lines
// (Figures.figures), from which hack/bench renders docs/benchmarks.md.
type Figures struct {
	Nodes     int
	GPUs      int
	Reporters []string
	// FlowControl says whether the agents had the chart's FlowSchema and priority level.
	FlowControl bool
	// Breaker says whether the agents ran the circuit breaker (GPUHEALTH_FLEET_BREAKER_FRACTION
	// of the GPUs, default 20%, above the wave), and BreakerBudget its budget in GPUs.
	Breaker       bool
	BreakerBudget int
	// When the budget is below the wave: the most rules ever seen with a disruptive effect at
	// once (never above the budget), and the seconds until exactly the budget had one.
	BreakerMaxDisruptive int
	BreakerSettleSeconds float64

	// SetupSeconds is creating the Nodes and ResourceSlices (not part of the agent's cost).
	SetupSeconds float64
	// StartupSeconds is from starting every agent at once until every agent's /readyz is ok (every
	// reporter has done its start-up reconcile).
	StartupSeconds  float64
	StartupRequests int64
	StartupByKind   map[string]int64

	// Per node: Go heap in use and process RSS added by the agents, and their goroutines.
	HeapPerNodeKiB    float64
	RSSPerNodeKiB     float64
	GoroutinesPerNode float64

	// Steady state: nothing changes for SteadySeconds after start-up.
	SteadySeconds    float64
	SteadyRequests   int64
	SteadyPerSecond  float64
	SteadyByKind     map[string]int64
	SteadyWrites     int
	SteadyCPUPercent float64 // of one core, all agents together
	OpenWatches      int64
	WatchesPerNode   float64
	Transports       int64

	// The wave: WaveGPUs GPUs on WaveNodes nodes fail at once.
	WaveGPUs  int
	WaveNodes int
	// Seconds from the injection until the last object of each kind was seen through a watch.
	WaveAnnotationsSeconds float64
	WaveRulesSeconds       float64
	WaveConditionsSeconds  float64
	// WaveAllSeconds is the later of the annotations and the rules: what schedulers read.
	WaveAllSeconds float64
	// Per-object latency of the taints and annotations (p50, p99).
	WaveP50Seconds float64
	WaveP99Seconds float64
	WaveRequests   int64
	// WaveRewatches counts the observer's watches the API server closed during the wave.
	WaveRewatches int
	WaveByKind    map[string]int64
	WaveWrites    map[string]int

	// The bare wave (GPUHEALTH_FLEET_BARE, on unless 0): the same writes sent by bare clients
	// with the agents' identity, rate limits and concurrency, no agent logic: the API server's
	// own time for the wave, which WaveAllSeconds is compared with.
	BareWaveAllSeconds float64
	BareWaveRequests   int64
	BareWaveByKind     map[string]int64

	// The heartbeat phase (heartbeatPhase): every agent started again with agent.heartbeat
	// HeartbeatPeriodSeconds, and over HeartbeatWindowSeconds of steady state, the agents'
	// writes (Node writes by reporter, which should be none, and "lease": the heartbeat Lease
	// renewals) and requests (by kind); HeartbeatPerNodePerPeriod is the renewals per node per
	// period (issue 49: one Lease write, no Node write).
	HeartbeatPeriodSeconds    float64
	HeartbeatWindowSeconds    float64
	HeartbeatWrites           map[string]int
	HeartbeatPerNodePerPeriod float64
	HeartbeatRequests         int64
	HeartbeatByKind           map[string]int64

	// Agents is how many nodes ran a real agent (GPUHEALTH_FLEET_AGENTS); the others were written
	// as an agent writes them (simulated_test.go). AgentHeartbeatSeconds is the main run's
	// agent.heartbeat (GPUHEALTH_FLEET_AGENT_HEARTBEAT), at which the simulated nodes renew too.
	Agents                int
	AgentHeartbeatSeconds float64
	// Bytes of request and response bodies per second (watch streams included), at steady state
	// and over the wave's window (from the injection until its requests were counted).
	SteadyBytesPerSecond float64
	WaveWindowSeconds    float64
	WaveBytes            int64
	// Time to taint per faulty GPU: single faults on real agents one at a time (Faults of them)
	// and the wave, each beside a bare client's same writes.
	Faults              int
	FaultTaint          Percentiles
	FaultRule           Percentiles
	FaultAnnotation     Percentiles
	BareFaultTaint      Percentiles
	BareFaultRule       Percentiles
	BareFaultAnnotation Percentiles
	WaveTaint           Percentiles
	BareWaveTaint       Percentiles
	// The control plane's RSS at steady state and its peak over the run, MiB.
	APIServerRSSMiB, APIServerPeakRSSMiB float64
	EtcdRSSMiB, EtcdPeakRSSMiB           float64
	// The readers (GPUHEALTH_FLEET_READERS=1, readers_test.go).
	Readers               bool
	ExtenderSyncSeconds   float64
	ExtenderHeapMiB       float64
	ExtenderRSSMiB        float64
	FilterCalls           int
	FilterFitNodes        int
	FilterRequestBytes    int
	Filter                Percentiles
	CounterRecountSeconds float64
	CounterHeapMiB        float64
	CounterRSSMiB         float64
	StatusSeconds         float64
	StatusTimedOut        bool // stopped at GPUHEALTH_FLEET_STATUS_LIMIT, unfinished
	StatusMaxRSSMiB       float64
	StatusOutputMiB       float64
}

func report(t *testing.T, fig Figures) {
	t.Helper()
	var b strings.Builder
	flow := "the chart's FlowSchema and priority level"
	if !fig.FlowControl {
		flow = "default flow control"
	}
	if fig.Breaker {
		flow += fmt.Sprintf(", circuit breaker on (budget %d GPUs)", fig.BreakerBudget)
	}
	fmt.Fprintf(&b, "fleet: %d nodes × %d GPUs, %d of them with a real agent and its own client (the rest written as an agent writes them), reporters %s, %s, kube-apiserver %s on loopback\n",
		fig.Nodes, gpusPerNode, fig.Agents, strings.Join(fig.Reporters, ","), flow, controlplane.KubernetesVersion)
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| setup (Nodes + ResourceSlices) | %.1f s |\n", fig.SetupSeconds)
	fmt.Fprintf(&b, "| start-up: all agents ready | %.1f s, %d requests (%s) |\n", fig.StartupSeconds, fig.StartupRequests, kinds(fig.StartupByKind))
	fmt.Fprintf(&b, "| memory per node | heap %.0f KiB, RSS %.0f KiB, %.1f goroutines |\n", fig.HeapPerNodeKiB, fig.RSSPerNodeKiB, fig.GoroutinesPerNode)
	fmt.Fprintf(&b, "| open watches | %d (%.1f per node) over %d client transports |\n", fig.OpenWatches, fig.WatchesPerNode, fig.Transports)
	fmt.Fprintf(&b, "| steady state, %.0f s | %.2f requests/s (%s), %d writes, agents' CPU %.1f%% of a core |\n",
		fig.SteadySeconds, fig.SteadyPerSecond, kinds(fig.SteadyByKind), fig.SteadyWrites, fig.SteadyCPUPercent)
	fmt.Fprintf(&b, "| wave: %d GPUs on %d nodes fail at once | all taints and annotations in %.2f s (annotations %.2f s, rules %.2f s; per object p50 %.2f s, p99 %.2f s); conditions %.2f s |\n",
		fig.WaveGPUs, fig.WaveNodes, fig.WaveAllSeconds, fig.WaveAnnotationsSeconds, fig.WaveRulesSeconds, fig.WaveP50Seconds, fig.WaveP99Seconds, fig.WaveConditionsSeconds)
	fmt.Fprintf(&b, "| wave: API requests | %d (%s); writes %v; observer re-watches %d |\n", fig.WaveRequests, kinds(fig.WaveByKind), fig.WaveWrites, fig.WaveRewatches)
	if fig.BareWaveRequests > 0 {
		fmt.Fprintf(&b, "| bare wave: the same writes, no agent logic | all in %.2f s, %d requests (%s): the agents took %.2f× |\n",
			fig.BareWaveAllSeconds, fig.BareWaveRequests, kinds(fig.BareWaveByKind), fig.WaveAllSeconds/fig.BareWaveAllSeconds)
	}
	fmt.Fprintf(&b, "| API traffic | steady %.1f requests/s, %.1f KiB/s (agent.heartbeat %.0f s); wave %.0f requests/s, %.1f MiB/s over %.1f s |\n",
		fig.SteadyPerSecond, fig.SteadyBytesPerSecond/1024, fig.AgentHeartbeatSeconds, float64(fig.WaveRequests)/fig.WaveWindowSeconds, float64(fig.WaveBytes)/fig.WaveWindowSeconds/(1<<20), fig.WaveWindowSeconds)
	fmt.Fprintf(&b, "| control plane RSS | kube-apiserver %.0f MiB (peak %.0f), etcd %.0f MiB (peak %.0f) |\n", fig.APIServerRSSMiB, fig.APIServerPeakRSSMiB, fig.EtcdRSSMiB, fig.EtcdPeakRSSMiB)
	fmt.Fprintf(&b, "| time to taint, wave | %s; bare clients %s |\n", fig.WaveTaint, fig.BareWaveTaint)
	if fig.Faults > 0 {
		fmt.Fprintf(&b, "| time to taint, %d single faults | %s (rule %s; annotation %s); bare client %s (rule %s; annotation %s) |\n",
			fig.Faults, fig.FaultTaint, fig.FaultRule, fig.FaultAnnotation, fig.BareFaultTaint, fig.BareFaultRule, fig.BareFaultAnnotation)
	}
	if fig.Readers {
		fmt.Fprintf(&b, "| extender over %d nodes | caches synced in %.1f s, heap +%.0f MiB, RSS +%.0f MiB; /filter (%d calls, %.1f MiB request, %d nodes fit) %s |\n",
			fig.Nodes, fig.ExtenderSyncSeconds, fig.ExtenderHeapMiB, fig.ExtenderRSSMiB, fig.FilterCalls, float64(fig.FilterRequestBytes)/(1<<20), fig.FilterFitNodes, fig.Filter)
		fmt.Fprintf(&b, "| breaker counter | right count %.1f s after its start, heap +%.0f MiB, RSS +%.0f MiB |\n", fig.CounterRecountSeconds, fig.CounterHeapMiB, fig.CounterRSSMiB)
		unfinished := ""
		if fig.StatusTimedOut {
			unfinished = " (stopped at the limit, unfinished)"
		}
		fmt.Fprintf(&b, "| gpuhealth status -o json | %.1f s%s, peak RSS %.0f MiB, %.0f MiB of output |\n", fig.StatusSeconds, unfinished, fig.StatusMaxRSSMiB, fig.StatusOutputMiB)
	}
	if fig.HeartbeatPeriodSeconds > 0 {
		fmt.Fprintf(&b, "| heartbeat every %.0f s (agents started again), %.0f s window | %d writes %v, %d requests (%s): %.3f Lease renewals per node per period, no Node write (goal); at the default %g min, %.1f writes/s for %d nodes |\n",
			fig.HeartbeatPeriodSeconds, fig.HeartbeatWindowSeconds, sumWrites(fig.HeartbeatWrites), fig.HeartbeatWrites, fig.HeartbeatRequests, kinds(fig.HeartbeatByKind),
			fig.HeartbeatPerNodePerPeriod, config.DefaultHeartbeat.Minutes(), defaultHeartbeatRate(fig.Nodes, fig.HeartbeatPerNodePerPeriod), fig.Nodes)
	}
	if fig.BreakerSettleSeconds > 0 {
		fmt.Fprintf(&b, "| wave: circuit breaker | exactly the budget of %d GPUs NoSchedule after %.2f s, the rest None; never more than %d at once |\n",
			fig.BreakerBudget, fig.BreakerSettleSeconds, fig.BreakerMaxDisruptive)
	}
	fmt.Println(b.String())
	if path := os.Getenv("GPUHEALTH_FLEET_OUT"); path != "" {
		if err := figure.WriteFile(path, fig.figures()...); err != nil {
			t.Error(err)
		}
	}
}

// figures are fig as package figure's figures, under the names hack/bench looks for.
func (fig Figures) figures() []figure.Figure {
	one := func(name, unit string, v float64) figure.Figure {
		return figure.Figure{Name: name, Unit: unit, Value: v}
	}
	requests := func(name string, v int64, byKind map[string]int64) figure.Figure {
		f := one(name, figure.UnitRequests, float64(v))
		f.By = floats(byKind)
		return f
	}
	writes := one(figure.FleetWaveWrites, figure.UnitWrites, float64(sumWrites(fig.WaveWrites)))
	writes.By = floats(fig.WaveWrites)
	latency := one(figure.FleetWaveObjectLatency, figure.UnitSeconds, fig.WaveP50Seconds)
	latency.Percentiles = map[string]float64{figure.P50: fig.WaveP50Seconds, figure.P99: fig.WaveP99Seconds}
	figs := []figure.Figure{
		one(figure.FleetNodes, figure.UnitNodes, float64(fig.Nodes)),
		one(figure.FleetGPUs, figure.UnitGPUs, float64(fig.GPUs)),
		one(figure.FleetSetupTime, figure.UnitSeconds, fig.SetupSeconds),
		one(figure.FleetStartupTime, figure.UnitSeconds, fig.StartupSeconds),
		requests(figure.FleetStartupRequests, fig.StartupRequests, fig.StartupByKind),
		one(figure.FleetHeapPerNode, figure.UnitKiB, fig.HeapPerNodeKiB),
		one(figure.FleetRSSPerNode, figure.UnitKiB, fig.RSSPerNodeKiB),
		one(figure.FleetGoroutinesPerNode, figure.UnitGoroutines, fig.GoroutinesPerNode),
		one(figure.FleetOpenWatches, figure.UnitWatches, float64(fig.OpenWatches)),
		one(figure.FleetWatchesPerNode, figure.UnitWatches, fig.WatchesPerNode),
		one(figure.FleetClientTransports, figure.UnitTransports, float64(fig.Transports)),
		one(figure.FleetSteadyWindow, figure.UnitSeconds, fig.SteadySeconds),
		requests(figure.FleetSteadyRequests, fig.SteadyRequests, fig.SteadyByKind),
		one(figure.FleetSteadyRequestRate, figure.UnitRequestsPerSecond, fig.SteadyPerSecond),
		one(figure.FleetSteadyWrites, figure.UnitWrites, float64(fig.SteadyWrites)),
		one(figure.FleetSteadyCPU, figure.UnitCPU, fig.SteadyCPUPercent),
		one(figure.FleetWaveGPUs, figure.UnitGPUs, float64(fig.WaveGPUs)),
		one(figure.FleetWaveNodes, figure.UnitNodes, float64(fig.WaveNodes)),
		one(figure.FleetWaveAnnotationsTime, figure.UnitSeconds, fig.WaveAnnotationsSeconds),
		one(figure.FleetWaveRulesTime, figure.UnitSeconds, fig.WaveRulesSeconds),
		one(figure.FleetWaveConditionsTime, figure.UnitSeconds, fig.WaveConditionsSeconds),
		one(figure.FleetWaveAllTime, figure.UnitSeconds, fig.WaveAllSeconds),
		latency,
		requests(figure.FleetWaveRequests, fig.WaveRequests, fig.WaveByKind),
		writes,
		one(figure.FleetWaveRewatches, figure.UnitWatches, float64(fig.WaveRewatches)),
	}
	if fig.BareWaveRequests > 0 {
		figs = append(figs, one(figure.FleetBareWaveAllTime, figure.UnitSeconds, fig.BareWaveAllSeconds),
			requests(figure.FleetBareWaveRequests, fig.BareWaveRequests, fig.BareWaveByKind))
	}
	if fig.HeartbeatPeriodSeconds > 0 {
		beats := one(figure.FleetHeartbeatWrites, figure.UnitWrites, float64(sumWrites(fig.HeartbeatWrites)))
		beats.By = floats(fig.HeartbeatWrites)
		figs = append(figs, one(figure.FleetHeartbeatPeriod, figure.UnitSeconds, fig.HeartbeatPeriodSeconds),
			one(figure.FleetHeartbeatWindow, figure.UnitSeconds, fig.HeartbeatWindowSeconds),
			beats,
			one(figure.FleetHeartbeatPerNodePerPeriod, figure.UnitWritesPerNodePerPeriod, fig.HeartbeatPerNodePerPeriod),
			requests(figure.FleetHeartbeatRequests, fig.HeartbeatRequests, fig.HeartbeatByKind))
	}
	pct := func(name string, p Percentiles, samples int) figure.Figure {
		f := one(name, figure.UnitSeconds, p.P50)
		f.Samples = samples
		f.Percentiles = map[string]float64{figure.P50: p.P50, figure.P90: p.P90, figure.P99: p.P99}
		return f
	}
	figs = append(figs,
		one(figure.FleetAgents, figure.UnitNodes, float64(fig.Agents)),
		one(figure.FleetAgentHeartbeat, figure.UnitSeconds, fig.AgentHeartbeatSeconds),
		one(figure.FleetSteadyByteRate, figure.UnitBytesPerSecond, fig.SteadyBytesPerSecond),
		one(figure.FleetWaveWindow, figure.UnitSeconds, fig.WaveWindowSeconds),
		one(figure.FleetWaveRequestRate, figure.UnitRequestsPerSecond, float64(fig.WaveRequests)/fig.WaveWindowSeconds),
		one(figure.FleetWaveByteRate, figure.UnitBytesPerSecond, float64(fig.WaveBytes)/fig.WaveWindowSeconds),
		pct(figure.FleetWaveTaint, fig.WaveTaint, fig.WaveGPUs),
		one(figure.FleetAPIServerRSS, figure.UnitMiB, fig.APIServerRSSMiB),
		one(figure.FleetAPIServerPeakRSS, figure.UnitMiB, fig.APIServerPeakRSSMiB),
		one(figure.FleetEtcdRSS, figure.UnitMiB, fig.EtcdRSSMiB),
		one(figure.FleetEtcdPeakRSS, figure.UnitMiB, fig.EtcdPeakRSSMiB),
	)
	if fig.BareWaveRequests > 0 {
		figs = append(figs, pct(figure.FleetBareWaveTaint, fig.BareWaveTaint, fig.WaveGPUs))
	}
	if fig.Faults > 0 {
		figs = append(figs, pct(figure.FleetFaultTaint, fig.FaultTaint, fig.Faults), pct(figure.FleetBareFaultTaint, fig.BareFaultTaint, fig.Faults))
	}
	if fig.Readers {
		figs = append(figs, pct(figure.FleetFilter, fig.Filter, fig.FilterCalls),
			one(figure.FleetFilterFitNodes, figure.UnitNodes, float64(fig.FilterFitNodes)),
			one(figure.FleetExtenderSync, figure.UnitSeconds, fig.ExtenderSyncSeconds),
			one(figure.FleetExtenderHeap, figure.UnitMiB, fig.ExtenderHeapMiB),
			one(figure.FleetExtenderRSS, figure.UnitMiB, fig.ExtenderRSSMiB),
			one(figure.FleetCounterRecount, figure.UnitSeconds, fig.CounterRecountSeconds),
			one(figure.FleetCounterHeap, figure.UnitMiB, fig.CounterHeapMiB),
			one(figure.FleetCounterRSS, figure.UnitMiB, fig.CounterRSSMiB),
			one(figure.FleetStatusTime, figure.UnitSeconds, fig.StatusSeconds),
			one(figure.FleetStatusUnfinished, figure.UnitCalls, map[bool]float64{true: 1}[fig.StatusTimedOut]),
			one(figure.FleetStatusPeakRSS, figure.UnitMiB, fig.StatusMaxRSSMiB))
	}
	if fig.Breaker {
		figs = append(figs, one(figure.FleetBreakerBudget, figure.UnitGPUs, float64(fig.BreakerBudget)))
	}
	if fig.BreakerSettleSeconds > 0 { // the budget was below the wave
		figs = append(figs, one(figure.FleetBreakerSettleTime, figure.UnitSeconds, fig.BreakerSettleSeconds),
			one(figure.FleetBreakerMaxDisruptive, figure.UnitGPUs, float64(fig.BreakerMaxDisruptive)))
	}
	return figs
}

func floats[N int | int64](m map[string]N) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(v)
	}
	return out
}

// memory returns the Go heap in use and the process RSS (bytes) after a GC, and the goroutines.
func memory(t *testing.T) (heap, rss uint64, goroutines int) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kib, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			rss = kib * 1024
		}
	}
	return ms.HeapInuse, rss, runtime.NumGoroutine()
}

// processCPU is the user and system CPU time this process has used (every agent, plus the
// test's own idle loops).
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("parse /proc/self/stat: %v %v", err1, err2)
	}
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ is 100 on Linux
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(float64(len(sorted)-1)*p)]
}
