// Command bench measures every figure of docs/benchmarks.md and prints them as one table:
// `make bench`.
//
// Each figure is the median of several runs: the library benchmarks (go test -bench, -count 5,
// one core), the real `gpuhealth agent --backend sim` binary idle and under an XID storm (RSS and
// CPU from /proc), signal → API object latency and writes per change (TestBenchSignalToObject),
// the extender's filter at 5,000 nodes (its benchmark), and the fleet (test/fleet, GPUHEALTH_FLEET).
// Everything runs on loopback against control planes started by test/controlplane, one thing at
// a time, and everything started is stopped before the program exits.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

type options struct {
	gpuhealth   string
	out, raw    string
	runs        int
	agentWindow time.Duration
	stormRate   int
	faults      int
	fleetNodes  int
	fleetRuns   int
	fleetSteady time.Duration
	fleetLarge  int
	fleetBreak  bool
	skip        string
}

func main() {
	var o options
	flag.StringVar(&o.gpuhealth, "gpuhealth", "bin/gpuhealth", "the gpuhealth binary (make build)")
	flag.StringVar(&o.out, "out", "docs/benchmarks.md", "the document to write (empty: print only)")
	flag.StringVar(&o.raw, "raw", "bin/bench", "directory for the raw outputs and logs")
	flag.IntVar(&o.runs, "runs", 3, "runs of each agent and latency measurement")
	flag.DurationVar(&o.agentWindow, "agent-window", 15*time.Second, "how long each agent run is measured")
	flag.IntVar(&o.stormRate, "storm-rate", 100000, "XIDs per second over the 8 GPUs in the storm scenario")
	flag.IntVar(&o.faults, "faults", 100, "faults (each with its recovery) per latency run")
	flag.IntVar(&o.fleetNodes, "fleet-nodes", 500, "simulated nodes in the fleet")
	flag.IntVar(&o.fleetRuns, "fleet-runs", 3, "fleet runs")
	flag.DurationVar(&o.fleetSteady, "fleet-steady", 30*time.Second, "the fleet's steady-state window")
	flag.IntVar(&o.fleetLarge, "fleet-large", 2000, "nodes of one more fleet run, to show how the figures grow (0: none)")
	flag.BoolVar(&o.fleetBreak, "fleet-breaker", true, "one more fleet run with the circuit breaker on")
	flag.StringVar(&o.skip, "skip", "", "comma-separated parts to leave out: library,agent,latency,fleet")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// row is one line of the table.
type row struct{ what, figure, how string }

func run(ctx context.Context, o options) error {
	if err := os.MkdirAll(o.raw, 0o755); err != nil {
		return err
	}
	started := time.Now()
	machine, err := describeMachine(ctx)
	if err != nil {
		return err
	}
	skip := map[string]bool{}
	for _, s := range strings.Split(o.skip, ",") {
		skip[strings.TrimSpace(s)] = true
	}
	var rows []row
	var fleet *fleetSummary
	if !skip["library"] {
		r, err := libraryRows(ctx, o)
		if err != nil {
			return fmt.Errorf("library benchmarks: %w", err)
		}
		rows = append(rows, r...)
	}
	if !skip["agent"] {
		r, err := agentRows(ctx, o)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		rows = append(rows, r...)
	}
	if !skip["latency"] {
		r, err := latencyRows(ctx, o)
		if err != nil {
			return fmt.Errorf("signal -> object latency: %w", err)
		}
		rows = append(rows, r...)
	}
	if !skip["fleet"] {
		r, f, err := fleetRows(ctx, o)
		if err != nil {
			return fmt.Errorf("fleet: %w", err)
		}
		rows, fleet = append(rows, r...), f
	}
	table := renderTable(rows)
	fmt.Println()
	fmt.Println(table)
	progress("done in %s", time.Since(started).Round(time.Second))
	if o.out == "" {
		return nil
	}
	return os.WriteFile(o.out, []byte(document(o, machine, table, fleet, time.Since(started))), 0o644)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

// --- the machine ---

type machineInfo struct {
	cpus      int
	memGiB    float64
	cpuModel  string
	goVersion string
	kernel    string
	date      time.Time
}

func describeMachine(ctx context.Context) (machineInfo, error) {
	m := machineInfo{date: time.Now().UTC()}
	out, err := exec.CommandContext(ctx, "nproc").Output()
	if err != nil {
		return m, fmt.Errorf("nproc: %w", err)
	}
	if m.cpus, err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
		return m, fmt.Errorf("nproc: %w", err)
	}
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return m, err
	}
	if kib, ok := procField(string(meminfo), "MemTotal:"); ok {
		m.memGiB = float64(kib) / (1 << 20)
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return m, err
	}
	for line := range strings.Lines(string(cpuinfo)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			m.cpuModel = strings.TrimSpace(v)
			break
		}
	}
	out, err = exec.CommandContext(ctx, "go", "version").Output()
	if err != nil {
		return m, fmt.Errorf("go version: %w", err)
	}
	m.goVersion = strings.TrimPrefix(strings.TrimSpace(string(out)), "go version ")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	return m, nil
}

// procField returns the first number after key in a /proc file of "key: value unit" lines.
func procField(text, key string) (int64, bool) {
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// --- library and extender benchmarks ---

// benchResults holds, per benchmark name, per unit ("ns/op", "signals/s", ...), every run's value.
type benchResults map[string]map[string][]float64

func (r benchResults) median(name, unit string) (float64, int) {
	v := r[name][unit]
	return median(v), len(v)
}

func libraryRows(ctx context.Context, o options) ([]row, error) {
	progress("library and extender benchmarks (go test -bench, -count 5, one core; about a minute)")
	raw := filepath.Join(o.raw, "bench.txt")
	cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", ".", "-benchmem", "-count", "5", "-cpu", "1",
		"./pkg/health/...", "./internal/scheduling/...")
	out, err := runLogged(cmd, raw)
	if err != nil {
		return nil, err
	}
	res := parseBench(out)
	need := []string{"BenchmarkXIDStorm/xid=13", "BenchmarkMixedLoad", "BenchmarkStormRetainedMemory/signals=1000000", "BenchmarkExtenderFilter", "BenchmarkExtenderFilterNodeObjects"}
	for _, n := range need {
		if _, ok := res[n]; !ok {
			return nil, fmt.Errorf("%s missing from the benchmark output (%s)", n, raw)
		}
	}
	f := func(name, unit string) float64 { v, _ := res.median(name, unit); return v }
	_, runs := res.median("BenchmarkMixedLoad", "ns/op")
	how := fmt.Sprintf("go test -bench, median of %d, -cpu 1", runs)
	return []row{
		{"library: XID storm (one GPU, one XID repeated)", fmt.Sprintf("%s signals/s, %.0f B and %.0f allocs per signal",
			millions(f("BenchmarkXIDStorm/xid=13", "signals/s")), f("BenchmarkXIDStorm/xid=13", "B/op"), f("BenchmarkXIDStorm/xid=13", "allocs/op")), how},
		{"library: mixed load (every kind of signal, 8 GPUs)", fmt.Sprintf("%s signals/s, %.0f B and %.0f allocs per signal",
			millions(f("BenchmarkMixedLoad", "signals/s")), f("BenchmarkMixedLoad", "B/op"), f("BenchmarkMixedLoad", "allocs/op")), how},
		{"library: heap kept after 1,000,000 storm signals", fmt.Sprintf("%s (after 1,000: %s)",
			kib(f("BenchmarkStormRetainedMemory/signals=1000000", "retained-B")), kib(f("BenchmarkStormRetainedMemory/signals=1000", "retained-B"))), how},
		{"extender: /filter, 5,000 nodes × 8 GPUs, nodeCacheCapable", fmt.Sprintf("p50 %.2f ms, p99 %.2f ms",
			f("BenchmarkExtenderFilter", "p50-ms"), f("BenchmarkExtenderFilter", "p99-ms")), how},
		{"extender: /filter, 5,000 Node objects in the request", fmt.Sprintf("p50 %.0f ms, p99 %.0f ms",
			f("BenchmarkExtenderFilterNodeObjects", "p50-ms"), f("BenchmarkExtenderFilterNodeObjects", "p99-ms")), how},
	}, nil
}

// parseBench reads `go test -bench` output: "BenchmarkName  N  v1 unit1  v2 unit2 ...".
func parseBench(out []byte) benchResults {
	res := benchResults{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix, if any
			}
		}
		if res[name] == nil {
			res[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			res[name][f[i+1]] = append(res[name][f[i+1]], v)
		}
	}
	return res
}

// --- the agent binary, idle and under a storm ---

func agentRows(ctx context.Context, o options) ([]row, error) {
	progress("agent binary: %d runs × (idle, storm of %d XIDs/s) × %s, 8 simulated GPUs", o.runs, o.stormRate, o.agentWindow)
	if _, err := os.Stat(o.gpuhealth); err != nil {
		return nil, fmt.Errorf("%w (make build)", err)
	}
	c, err := controlplane.Start(ctx, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = c.Stop() }()
	dir, err := os.MkdirTemp("", "gpuhealth-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	kubeconfig, err := agentKubeconfig(ctx, c, dir)
	if err != nil {
		return nil, err
	}

	results := map[string][]agentSample{}
	for r := range o.runs {
		for _, kind := range []string{"idle", "storm"} {
			node := fmt.Sprintf("bench-%s-%d", kind, r)
			if _, err := c.CreateReadyNode(ctx, node, nil); err != nil {
				return nil, err
			}
			uuids := make([]string, 8)
			for i := range uuids {
				uuids[i] = sim.GPUUUID(node, i)
			}
			if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(node, uuids...), metav1.CreateOptions{}); err != nil {
				return nil, err
			}
			scenario := filepath.Join(dir, node+".yaml")
			if err := os.WriteFile(scenario, []byte(agentScenario(node, kind, o)), 0o644); err != nil {
				return nil, err
			}
			m, err := measureAgent(ctx, o, dir, node, scenario, kubeconfig)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", node, err)
			}
			progress("  %s: RSS %.1f MiB (anonymous %.1f, file-backed %.1f; peak %.1f), Go heap %.1f MiB, CPU %.1f%%, %.0f XIDs/s evaluated",
				node, m.rssKiB/1024, m.anonKiB/1024, m.fileKiB/1024, m.hwmKiB/1024, m.heapKiB/1024, m.cpuPct, m.xidRate)
			results[kind] = append(results[kind], m)
		}
	}
	how := fmt.Sprintf("`gpuhealth agent --backend sim`, /proc/PID, %s window, median of %d", o.agentWindow, o.runs)
	var rows []row
	for _, kind := range []string{"idle", "storm"} {
		s := results[kind]
		mib := func(get func(agentSample) float64) float64 { return median(collect(s, get)) / 1024 }
		what := "agent: idle, 8 simulated GPUs (sampling every 10 s)"
		if kind == "storm" {
			rate := median(collect(s, func(x agentSample) float64 { return x.xidRate }))
			what = fmt.Sprintf("agent: XID storm, 8 simulated GPUs, %s XIDs/s evaluated (gpuhealth_xid_total)", thousands(int(rate)))
		}
		rows = append(rows, row{what, fmt.Sprintf("RSS %.1f MiB (anonymous %.1f, file-backed %.1f; peak %.1f), Go heap %.1f MiB, CPU %.1f%% of a core",
			mib(func(x agentSample) float64 { return x.rssKiB }), mib(func(x agentSample) float64 { return x.anonKiB }),
			mib(func(x agentSample) float64 { return x.fileKiB }), mib(func(x agentSample) float64 { return x.hwmKiB }),
			mib(func(x agentSample) float64 { return x.heapKiB }), median(collect(s, func(x agentSample) float64 { return x.cpuPct }))), how})
	}
	return rows, nil
}

// agentScenario is 8 GPUs with no events (idle), or 8 GPUs each sent XID 13 (counted, the GPU
// stays Healthy: the library's hot path) stormRate/8 times a second, in bursts every 100 ms, for
// longer than the agent runs.
func agentScenario(node, kind string, o options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: 8}\n", node)
	if kind == "idle" {
		return b.String()
	}
	repeat := max(1, o.stormRate/8/10)
	b.WriteString("events:\n")
	end := o.agentWindow + time.Minute
	for at := time.Duration(0); at < end; at += 100 * time.Millisecond {
		for g := range 8 {
			fmt.Fprintf(&b, "  - {at: %dms, gpu: %d, xid: 13, repeat: %d}\n", at.Milliseconds(), g, repeat)
		}
	}
	return b.String()
}

// agentSample is one agent run's figures: resident memory (all, anonymous, file-backed, peak) and
// the Go heap in use, in KiB; CPU in percent of a core; XIDs evaluated per second.
type agentSample struct{ rssKiB, anonKiB, fileKiB, hwmKiB, heapKiB, cpuPct, xidRate float64 }

// measureAgent runs the agent until ready, lets it settle, and measures its CPU over the window
// and its memory at the end.
func measureAgent(ctx context.Context, o options, dir, node, scenario, kubeconfig string) (m agentSample, err error) {
	port, err := freePort()
	if err != nil {
		return m, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logPath := filepath.Join(o.raw, "agent-"+node+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return m, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, o.gpuhealth, "agent", "--backend", "sim", "--scenario", scenario, "--node-name", node,
		"--kubeconfig", kubeconfig, "--checkpoint", filepath.Join(dir, node+".checkpoint"), "--metrics-address", addr)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return m, err
	}
	// done is closed once the agent has exited; waitErr says how.
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-done:
			return m, fmt.Errorf("agent exited before it was ready (log %s): %w", logPath, waitErr)
		case <-ctx.Done():
			return m, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return m, fmt.Errorf("agent not ready after 2 minutes; log %s", logPath)
		}
	}
	time.Sleep(2 * time.Second) // past the start-up reconcile
	pid := cmd.Process.Pid
	cpu0, err := procCPU(pid)
	if err != nil {
		return m, err
	}
	xids0, err := xidTotal(addr)
	if err != nil {
		return m, err
	}
	t0 := time.Now()
	select {
	case <-time.After(o.agentWindow):
	case <-ctx.Done():
		return m, ctx.Err()
	}
	cpu1, err := procCPU(pid)
	if err != nil {
		return m, err
	}
	elapsed := time.Since(t0)
	xids1, err := xidTotal(addr)
	if err != nil {
		return m, err
	}
	m.xidRate = (xids1 - xids0) / elapsed.Seconds()
	m.cpuPct = 100 * (cpu1 - cpu0).Seconds() / elapsed.Seconds()
	heap, err := metricValue(addr, "go_memstats_heap_inuse_bytes")
	if err != nil {
		return m, err
	}
	m.heapKiB = heap / 1024
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for field, into := range map[string]*float64{"VmRSS:": &m.rssKiB, "RssAnon:": &m.anonKiB, "RssFile:": &m.fileKiB, "VmHWM:": &m.hwmKiB} {
		v, _ := procField(string(status), field)
		*into = float64(v)
	}
	return m, nil
}

// xidTotal sums the agent's gpuhealth_xid_total: the XIDs it has evaluated.
func xidTotal(addr string) (float64, error) { return metricValue(addr, "gpuhealth_xid_total") }

// metricValue sums the samples of one metric the agent serves.
func metricValue(addr, name string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	var sum float64
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum, nil
}

// procCPU is utime + stime of a process.
func procCPU(pid int) (time.Duration, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / 100, nil // USER_HZ is 100 on Linux
}

// agentKubeconfig gives the agent a ServiceAccount bound to agent.ClusterRoleRules, as the chart
// does, and writes a kubeconfig with its token.
func agentKubeconfig(ctx context.Context, c *controlplane.Cluster, dir string) (string, error) {
	const ns, name = "gpuhealth-system", "gpuhealth-agent"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		return "", err
	}
	admin := c.Admin()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: agent.ClusterRoleRules()}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	cfg, err := c.ServiceAccountConfig(ctx, ns, name)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "agent.kubeconfig")
	return path, c.WriteKubeconfig(path, cfg)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// --- signal -> API object latency (test/e2e TestBenchSignalToObject) ---

func latencyRows(ctx context.Context, o options) ([]row, error) {
	progress("signal -> object latency: %d runs × %d faults and recoveries (TestBenchSignalToObject)", o.runs, o.faults)
	lat := map[string]map[string][]float64{} // path -> p50|p99 -> ms
	var paths []string
	perChange := map[string][]float64{}
	var sinks []string
	for r := range o.runs {
		out := filepath.Join(o.raw, fmt.Sprintf("latency-%d.md", r))
		_ = os.Remove(out)
		cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", "e2e", "-run", "^TestBenchSignalToObject$", "-timeout", "20m", "./test/e2e/")
		// The claimstatus reporter writes nothing here (the test makes no ResourceClaims), and the
		// test expects one write per change of every sink but the condition, so it is left out.
		cmd.Env = append(os.Environ(), "GPUHEALTH_BENCH_FAULTS="+strconv.Itoa(o.faults), "GPUHEALTH_BENCH_OUT="+absPath(out),
			"GPUHEALTH_BENCH_REPORTERS=annotation,devicetaint,condition")
		if _, err := runLogged(cmd, filepath.Join(o.raw, fmt.Sprintf("latency-%d.log", r))); err != nil {
			return nil, err
		}
		md, err := os.ReadFile(out)
		if err != nil {
			return nil, err
		}
		for _, cells := range tableRows(string(md)) {
			switch len(cells) {
			case 4: // | path | p50 | p99 | max |  or  | sink | writes | changes | per change |
				p50, err1 := time.ParseDuration(cells[1])
				p99, err2 := time.ParseDuration(cells[2])
				if err1 == nil && err2 == nil {
					if lat[cells[0]] == nil {
						lat[cells[0]] = map[string][]float64{}
						paths = append(paths, cells[0])
					}
					lat[cells[0]]["p50"] = append(lat[cells[0]]["p50"], ms(p50))
					lat[cells[0]]["p99"] = append(lat[cells[0]]["p99"], ms(p99))
					continue
				}
				if v, err := strconv.ParseFloat(cells[3], 64); err == nil {
					if perChange[cells[0]] == nil {
						sinks = append(sinks, cells[0])
					}
					perChange[cells[0]] = append(perChange[cells[0]], v)
				}
			}
		}
		progress("  run %d: %s", r+1, strings.Join(strings.Fields(summaryLine(lat, paths)), " "))
	}
	how := fmt.Sprintf("TestBenchSignalToObject, %d faults + %d recoveries per run, median of %d runs' percentiles", o.faults, o.faults, o.runs)
	var rows []row
	for _, p := range paths {
		rows = append(rows, row{"signal → object: " + p, fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", median(lat[p]["p50"]), median(lat[p]["p99"])), how})
	}
	var w []string
	for _, s := range sinks {
		w = append(w, fmt.Sprintf("%s %.2f", s, median(perChange[s])))
	}
	rows = append(rows, row{"API writes per GPU state change, by sink", strings.Join(w, ", "), how})
	return rows, nil
}

func summaryLine(lat map[string]map[string][]float64, paths []string) string {
	var parts []string
	for _, p := range paths {
		v := lat[p]["p50"]
		parts = append(parts, fmt.Sprintf("%s p50 %.1fms;", p, v[len(v)-1]))
	}
	return strings.Join(parts, " ")
}

// tableRows returns the cells of each data row of the markdown tables in md.
func tableRows(md string) [][]string {
	var out [][]string
	for line := range strings.Lines(md) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		out = append(out, cells)
	}
	return out
}

// --- the fleet (test/fleet) ---

// fleetFigures is the part of test/fleet's Figures this program reads.
type fleetFigures struct {
	Nodes                  int              `json:"nodes"`
	GPUs                   int              `json:"gpus"`
	Reporters              []string         `json:"reporters"`
	Breaker                bool             `json:"breaker"`
	BreakerBudget          int              `json:"breakerBudget"`
	BreakerMaxDisruptive   int              `json:"breakerMaxDisruptive"`
	BreakerSettleSeconds   float64          `json:"breakerSettleSeconds"`
	StartupSeconds         float64          `json:"startupSeconds"`
	StartupRequests        int64            `json:"startupRequests"`
	HeapPerNodeKiB         float64          `json:"heapPerNodeKiB"`
	RSSPerNodeKiB          float64          `json:"rssPerNodeKiB"`
	GoroutinesPerNode      float64          `json:"goroutinesPerNode"`
	SteadySeconds          float64          `json:"steadySeconds"`
	SteadyPerSecond        float64          `json:"steadyRequestsPerSecond"`
	SteadyByKind           map[string]int64 `json:"steadyByKind"`
	SteadyWrites           int              `json:"steadyWrites"`
	SteadyCPUPercent       float64          `json:"steadyCPUPercent"`
	WatchesPerNode         float64          `json:"watchesPerNode"`
	WaveGPUs               int              `json:"waveGPUs"`
	WaveNodes              int              `json:"waveNodes"`
	WaveAllSeconds         float64          `json:"waveAllSeconds"`
	WaveAnnotationsSeconds float64          `json:"waveAnnotationsSeconds"`
	WaveRulesSeconds       float64          `json:"waveRulesSeconds"`
	WaveConditionsSeconds  float64          `json:"waveConditionsSeconds"`
	WaveP50Seconds         float64          `json:"waveP50Seconds"`
	WaveP99Seconds         float64          `json:"waveP99Seconds"`
	WaveRequests           int64            `json:"waveRequests"`
	WaveByKind             map[string]int64 `json:"waveByKind"`
	StartupByKind          map[string]int64 `json:"startupByKind"`
}

// fleetSummary is what the document says about the fleet beyond the table: every run's
// figures, the larger run's last.
type fleetSummary struct{ runs []fleetFigures }

// fleetRun runs test/fleet once with nodes nodes (and env added) and returns its figures.
func fleetRun(ctx context.Context, o options, nodes int, name string, env ...string) (fleetFigures, error) {
	var f fleetFigures
	out := filepath.Join(o.raw, name+".json")
	_ = os.Remove(out)
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-tags", "e2e", "-run", "^TestFleet$", "-timeout", "20m", "-v", "./test/fleet/")
	cmd.Env = append(os.Environ(), "GPUHEALTH_FLEET=1", "GPUHEALTH_FLEET_NODES="+strconv.Itoa(nodes),
		"GPUHEALTH_FLEET_STEADY="+o.fleetSteady.String(), "GPUHEALTH_FLEET_OUT="+absPath(out))
	cmd.Env = append(cmd.Env, env...)
	if _, err := runLogged(cmd, filepath.Join(o.raw, name+".log")); err != nil {
		return f, err
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("%s: %w", out, err)
	}
	progress("  %s: %d nodes ready in %.1fs, %.2f requests/s steady, wave in %.2fs", name, f.Nodes, f.StartupSeconds, f.SteadyPerSecond, f.WaveAllSeconds)
	return f, nil
}

func fleetRows(ctx context.Context, o options) ([]row, *fleetSummary, error) {
	progress("fleet: %d runs × %d nodes × 8 GPUs (test/fleet), then one run × %d nodes", o.fleetRuns, o.fleetNodes, o.fleetLarge)
	var runs []fleetFigures
	for r := range o.fleetRuns {
		f, err := fleetRun(ctx, o, o.fleetNodes, fmt.Sprintf("fleet-%d", r))
		if err != nil {
			return nil, nil, err
		}
		runs = append(runs, f)
	}
	med := func(get func(fleetFigures) float64) float64 { return median(collect(runs, get)) }
	f0 := runs[0]
	how := fmt.Sprintf("test/fleet, one process, own client per node, median of %d", len(runs))
	rows := []row{
		{fmt.Sprintf("fleet: %d nodes × 8 GPUs, start-up until every agent is ready", f0.Nodes),
			fmt.Sprintf("%.1f s, %.0f requests", med(func(f fleetFigures) float64 { return f.StartupSeconds }), med(func(f fleetFigures) float64 { return float64(f.StartupRequests) })), how},
		{"fleet: agent memory per node (in one process)",
			fmt.Sprintf("heap %.0f KiB, RSS %.0f KiB, %.0f goroutines, %.0f watches", med(func(f fleetFigures) float64 { return f.HeapPerNodeKiB }),
				med(func(f fleetFigures) float64 { return f.RSSPerNodeKiB }), med(func(f fleetFigures) float64 { return f.GoroutinesPerNode }),
				med(func(f fleetFigures) float64 { return f.WatchesPerNode })), how},
		{fmt.Sprintf("fleet: API requests at steady state (%.0f s, resync 1 h)", f0.SteadySeconds),
			fmt.Sprintf("%.2f requests/s for the whole fleet, %.0f writes; agents' CPU %.1f%% of a core",
				med(func(f fleetFigures) float64 { return f.SteadyPerSecond }), med(func(f fleetFigures) float64 { return float64(f.SteadyWrites) }),
				med(func(f fleetFigures) float64 { return f.SteadyCPUPercent })), how},
		{fmt.Sprintf("fleet: 10%% of GPUs fail at once (%d GPUs on %d nodes)", f0.WaveGPUs, f0.WaveNodes),
			fmt.Sprintf("all taints and annotations in %.1f s (rules %.1f s, annotations %.1f s; per object p50 %.2f s, p99 %.1f s); %.0f requests",
				med(func(f fleetFigures) float64 { return f.WaveAllSeconds }), med(func(f fleetFigures) float64 { return f.WaveRulesSeconds }),
				med(func(f fleetFigures) float64 { return f.WaveAnnotationsSeconds }), med(func(f fleetFigures) float64 { return f.WaveP50Seconds }),
				med(func(f fleetFigures) float64 { return f.WaveP99Seconds }), med(func(f fleetFigures) float64 { return float64(f.WaveRequests) })), how},
	}
	summary := &fleetSummary{runs: runs}
	if o.fleetLarge > 0 {
		f, err := fleetRun(ctx, o, o.fleetLarge, "fleet-large")
		if err != nil {
			return nil, nil, err
		}
		summary.runs = append(summary.runs, f)
		rows = append(rows, row{
			fmt.Sprintf("fleet: %d nodes × 8 GPUs (%d GPUs fail at once)", f.Nodes, f.WaveGPUs),
			fmt.Sprintf("start-up %.1f s; steady %.2f requests/s; wave: all taints and annotations in %.1f s (p99 %.1f s), %d requests",
				f.StartupSeconds, f.SteadyPerSecond, f.WaveAllSeconds, f.WaveP99Seconds, f.WaveRequests),
			"test/fleet, one run",
		})
	}
	if o.fleetBreak {
		f, err := fleetRun(ctx, o, o.fleetNodes, "fleet-breaker", "GPUHEALTH_FLEET_BREAKER=1", "GPUHEALTH_FLEET_BREAKER_FRACTION=0.05")
		if err != nil {
			return nil, nil, err
		}
		summary.runs = append(summary.runs, f)
		rows = append(rows, row{
			fmt.Sprintf("fleet: %d nodes, circuit breaker on, budget 5%% (%d GPUs) against the 10%% wave", f.Nodes, f.BreakerBudget),
			fmt.Sprintf("all taints and annotations in %.1f s; exactly %d GPUs NoSchedule after %.1f s, never more than %d at once, the rest None; %d requests; heap %.0f KiB per node",
				f.WaveAllSeconds, f.BreakerBudget, f.BreakerSettleSeconds, f.BreakerMaxDisruptive, f.WaveRequests, f.HeapPerNodeKiB),
			"test/fleet GPUHEALTH_FLEET_BREAKER=1, one run",
		})
	}
	return rows, summary, nil
}

// --- output ---

func renderTable(rows []row) string {
	var b strings.Builder
	b.WriteString("| what | median | how |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.what, r.figure, r.how)
	}
	return b.String()
}

func document(o options, m machineInfo, table string, fleet *fleetSummary, took time.Duration) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\n")
	b.WriteString("Written by `make bench` (hack/bench); every figure below comes from that one command. Rerun it to\n" +
		"refresh this page; figures from another machine belong on another page.\n\n")
	fmt.Fprintf(&b, "Measured %s on %d CPUs (`nproc`) of %s, %.1f GiB memory, Linux %s, %s.\n"+
		"The machine was shared with other work while it ran, so treat small differences as noise. `make bench` took %s.\n\n",
		m.date.Format("2006-01-02 15:04 MST"), m.cpus, cmp.Or(m.cpuModel, "an unknown CPU"), m.memGiB, m.kernel, m.goVersion,
		took.Round(time.Second))
	b.WriteString(table)
	b.WriteString(`
## What each figure is

- **library**: ` + "`BenchmarkXIDStorm`, `BenchmarkMixedLoad` and `BenchmarkStormRetainedMemory`" + ` (pkg/health), with
  ` + "`-count 5 -cpu 1 -benchmem`" + `; the median of the five runs. A repeated identical signal allocates nothing.
- **agent**: the real ` + "`gpuhealth agent --backend sim`" + ` binary (all reporters, default HealthConfig: sampling every
  10 s, resync 5 min) against a local kube-apiserver, as its own least-privilege ServiceAccount. Each run waits for
  ` + "`/readyz`" + `, waits 2 s more, then reads utime+stime from ` + "`/proc/PID/stat`" + ` across the window and VmRSS
  (RssAnon and RssFile: anonymous memory and the binary's mapped pages; VmHWM as the peak) from
  ` + "`/proc/PID/status`" + ` at its end, and the Go heap in use from the agent's own ` + "`go_memstats_heap_inuse_bytes`" + `. *Idle* is 8 GPUs and no events; the *storm* sends
  XID 13 (counted, the GPU stays Healthy) to all 8 GPUs in bursts every 100 ms.
- **signal → object**: ` + "`TestBenchSignalToObject`" + ` (test/e2e, ` + "`make bench-e2e`" + `): an in-process agent with the
  CLI's client rate limits; each fault and recovery is timed from the signal until the object is seen through a
  watch. The p50 and p99 quoted are the medians of the runs' p50s and p99s. Writes per change count the
  ` + "`gpuhealth_api_writes_total`" + ` increments per GPU state change (the condition writer also rewrites its message
  when the set of sick GPUs changes).
- **extender**: ` + "`BenchmarkExtenderFilter`" + ` and ` + "`BenchmarkExtenderFilterNodeObjects`" + ` (internal/scheduling/extender):
  one /filter call for a 4-GPU pod over 5,000 nodes × 8 GPUs, p50/p99 per call over the benchmark's iterations.
- **fleet**: ` + "`TestFleet`" + ` (test/fleet): N simulated nodes × 8 GPUs in one process, each with its own
  ` + "`agent.Run`" + `, its own clientset and its own connection (an uncacheable transport, as separate processes would
  have), all reporters, resync 1 h, sharing one ServiceAccount as a DaemonSet does, with the chart's
  FlowSchema and priority level for it, against one kube-apiserver
  (no scheduler or controller-manager). Requests are counted by a ` + "`rest.Config.WrapTransport`" + ` on every
  client. *Start-up* runs from starting every agent at once until every ` + "`/readyz`" + ` is ok. *Memory per node* is the
  growth of the Go heap in use and of the process RSS, after a GC, divided by N (the API server's own memory
  is not included). *Steady state* is a quiet window after start-up. In the *wave* one GPU in ten
  (` + "`(node*8+gpu) % 10 == 0`" + `, at most one per node) gets XID 48 at the same instant through the agents'
  channel backends; the time is until the last DeviceTaintRule and the last ` + "`volcano.sh/gpu-unhealthy-ids`" + `
  annotation are seen through the test's watches. The test asserts only correctness (every expected rule and
  annotation exists at the end, nothing else does, one write per change), never a time. The larger run
  repeats all of it once with more nodes. The breaker run turns the circuit breaker on, with its
  controller (the GPU count) in the test process and a budget of 5% of the GPUs, half the wave: 400
  agents race for 200 slots, and the test fails if more than the budget ever had NoSchedule at once
  or if the final state is not exactly the budget NoSchedule and the rest None.

Reading the fleet figures: the steady state costs no requests at all (no lease, no polling; the 3
watches per agent, each selected by the agent's node through a selector the API server indexes, stay
open), so what remains beyond resyncs is one resync per reporter per hour here (5 minutes by default).
A GPU state change costs exactly four requests: the annotation patch, the condition patch, the
DeviceTaintRule and an Event; the writers read the Node from the agent's shared informer cache, not
with a GET, and no agent watches DeviceTaintRules or ResourceClaims cluster-wide (docs/agent.md says
why). The agents' ServiceAccount gets the chart's FlowSchema and priority level
(` + "`internal/agent.FlowControl`" + `): without them the default FlowSchemas put every agent into one flow
of workload-low with short queues, and most of a wave's burst came back as HTTP 429 (15.3 s for the
500-node wave, 468 rejections; ` + "`GPUHEALTH_FLEET_FLOWCONTROL=0`" + ` reproduces it). With them no request is
rejected up to 1,000 nodes; at 2,000 nodes the wave's 6,400 simultaneous requests overflow the default
queue of 5,000 and the excess is retried (` + "`agent.flowControl.queueLengthLimit`" + ` sizes the queue: four
requests per node that changes at once). The agents, the test and the API server share the same 2 cores, so the wave's time is mostly
CPU; it varies between runs on a shared machine, and the per-run table below shows the spread.

The fleet test is too heavy for every CI run: it is skipped unless ` + "`GPUHEALTH_FLEET=1`" + `. Run it alone with

` + "```sh" + `
GPUHEALTH_FLEET=1 GPUHEALTH_FLEET_NODES=500 GPUHEALTH_CONTROLPLANE_BIN="$(hack/controlplane/build.sh)" \
  go test -tags e2e -count=1 -v -timeout 20m -run '^TestFleet$' ./test/fleet/
` + "```" + `

(` + "`GPUHEALTH_FLEET_STEADY`" + ` sets the steady window, default 30s; ` + "`GPUHEALTH_FLEET_REPORTERS`" + ` a comma-separated
reporter list, default all; ` + "`GPUHEALTH_FLEET_OUT`" + ` a file for the figures as JSON; ` + "`GPUHEALTH_FLEET_FLOWCONTROL=0`" + `
leaves out the FlowSchema; ` + "`GPUHEALTH_FLEET_KEEP`" + ` a directory for the control plane's logs.)
`)
	if fleet != nil && len(fleet.runs) > 0 {
		b.WriteString("\n## The fleet's runs\n\n")
		b.WriteString("| run | nodes | start-up | steady requests/s (by kind) | wave: all written | wave requests (by kind, failed ones again by status) |\n|---|---|---|---|---|---|\n")
		for i, f := range fleet.runs {
			run := strconv.Itoa(i + 1)
			if f.Breaker {
				run += " (breaker)"
			}
			fmt.Fprintf(&b, "| %s | %d | %.1f s, %d requests | %.2f (%s) | %.2f s | %d (%s) |\n", run, f.Nodes, f.StartupSeconds, f.StartupRequests,
				f.SteadyPerSecond, byKind(f.SteadyByKind), f.WaveAllSeconds, f.WaveRequests, byKind(f.WaveByKind))
		}
		f := fleet.runs[0]
		fmt.Fprintf(&b, "\nStart-up requests of run 1 by kind: %s.\n", byKind(f.StartupByKind))
	}
	fmt.Fprintf(&b, "\n## Knobs\n\n`go run ./hack/bench -h`: runs (%d), agent window (%s), storm rate (%s XIDs/s), faults per latency run (%d), fleet nodes (%d), fleet runs (%d), fleet steady window (%s), the larger fleet run (%d nodes, `-fleet-large 0` skips it), the run with the circuit breaker (`-fleet-breaker=false` skips it); `-skip library,agent,latency,fleet` leaves parts out. Raw outputs and logs go to `%s/`.\n",
		o.runs, o.agentWindow, thousands(o.stormRate), o.faults, o.fleetNodes, o.fleetRuns, o.fleetSteady, o.fleetLarge, o.raw)
	return b.String()
}

func byKind(m map[string]int64) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// --- helpers ---

// runLogged runs cmd with its output in logPath (and returns it); on failure the error carries
// the log's tail.
func runLogged(cmd *exec.Cmd, logPath string) ([]byte, error) {
	var buf bytes.Buffer
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd.Stdout = io.MultiWriter(f, &buf)
	cmd.Stderr = cmd.Stdout
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, lastLines(buf.Bytes(), 40))
	}
	return buf.Bytes(), nil
}

func lastLines(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func collect[T any](xs []T, f func(T) float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = f(x)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func millions(v float64) string { return fmt.Sprintf("%.1f M", v/1e6) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

func thousands(n int) string {
	s := strconv.Itoa(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
