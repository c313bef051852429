package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/internal/agent/agenttest"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// The agent's scenarios: figures of the agent part carry one as their labelScenario.
const (
	labelScenario = "scenario"
	scenarioIdle  = "idle"
	scenarioStorm = "storm"
)

// measureAgent runs the real agent binary, idle and under an XID storm, o.Runs times each, and
// returns each run's figures.
func measureAgent(ctx context.Context, o options) ([]figure.Figure, error) {
	progress("agent binary %s: %d runs × (idle, storm of %d XIDs/s) × %s, 8 simulated GPUs", o.agent, o.Runs, o.StormRate, o.AgentWindow)
	bin, err := os.Stat(o.agent)
	if err != nil {
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

	var figs []figure.Figure
	for r := range o.Runs {
		for _, kind := range []string{scenarioIdle, scenarioStorm} {
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
			m, err := measureAgentRun(ctx, o, dir, node, scenario, kubeconfig)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", node, err)
			}
			m.binaryKiB = float64(bin.Size()) / 1024
			progress("  %s: RSS %.1f MiB (anonymous %.1f, file-backed %.1f; peak %.1f), Go heap %.1f MiB, CPU %.1f%%, %.0f XIDs/s evaluated",
				node, m.rssKiB/1024, m.anonKiB/1024, m.fileKiB/1024, m.hwmKiB/1024, m.heapKiB/1024, m.cpuPct, m.xidRate)
			figs = append(figs, m.figures(kind, strconv.Itoa(r+1))...)
		}
	}
	return figs, nil
}

// agentScenario is 8 GPUs with no events (idle), or 8 GPUs each sent XID 13 (counted, the GPU
// stays Healthy: the library's hot path) stormRate/8 times a second, in bursts every 100 ms, for
// longer than the agent runs.
func agentScenario(node, kind string, o options) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: 8}\n", node)
	if kind == scenarioIdle {
		return b.String()
	}
	repeat := max(1, o.StormRate/8/10)
	b.WriteString("events:\n")
	end := time.Duration(o.AgentWindow) + time.Minute
	for at := time.Duration(0); at < end; at += 100 * time.Millisecond {
		for g := range 8 {
			fmt.Fprintf(&b, "  - {at: %dms, gpu: %d, xid: 13, repeat: %d}\n", at.Milliseconds(), g, repeat)
		}
	}
	return b.String()
}

// agentSample is one agent run's figures: resident memory (all, anonymous, file-backed, peak),
// the Go heap in use and the binary's size, in KiB; CPU in percent of a core; XIDs evaluated per
// second.
type agentSample struct{ rssKiB, anonKiB, fileKiB, hwmKiB, heapKiB, cpuPct, xidRate, binaryKiB float64 }

// Names and units of the agent's figures.
const (
	agentRSS     = "rss"
	agentRSSAnon = "rss_anon"
	agentRSSFile = "rss_file"
	agentRSSPeak = "rss_peak"
	agentGoHeap  = "go_heap"
	agentCPU     = "cpu"
	agentXIDRate = "xid_rate"
	agentBinary  = "binary_size"

	unitXIDRate = "XIDs/s"
)

func (m agentSample) figures(scenario, run string) []figure.Figure {
	fig := func(name, unit string, v float64) figure.Figure {
		return figure.Figure{Part: partAgent, Run: run, Name: name, Labels: map[string]string{labelScenario: scenario}, Unit: unit, Value: v}
	}
	return []figure.Figure{
		fig(agentRSS, figure.UnitKiB, m.rssKiB), fig(agentRSSAnon, figure.UnitKiB, m.anonKiB), fig(agentRSSFile, figure.UnitKiB, m.fileKiB),
		fig(agentRSSPeak, figure.UnitKiB, m.hwmKiB), fig(agentGoHeap, figure.UnitKiB, m.heapKiB),
		fig(agentCPU, figure.UnitCPU, m.cpuPct), fig(agentXIDRate, unitXIDRate, m.xidRate), fig(agentBinary, figure.UnitKiB, m.binaryKiB),
	}
}

// measureAgentRun runs the agent until ready, lets it settle, and measures its CPU over the
// window and its memory at the end.
func measureAgentRun(ctx context.Context, o options, dir, node, scenario, kubeconfig string) (m agentSample, err error) {
	port, err := freePort()
	if err != nil {
		return m, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	logPath := filepath.Join(o.Raw, "agent-"+node+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return m, err
	}
	defer logFile.Close()
	if err := evictFromPageCache(o.agent); err != nil {
		return m, err
	}
	cmd := exec.CommandContext(ctx, o.agent, "agent", "--backend", "sim", "--scenario", scenario, "--node-name", node,
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
	case <-time.After(time.Duration(o.AgentWindow)):
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

// evictFromPageCache drops the file's pages from the page cache, so that every run starts from the
// same state: the agent's RssFile is then the pages it faulted in itself (with the kernel's
// readahead). A binary whose pages are all cached, as right after it was written, is mapped
// nearly whole instead: how much of it is cached would decide the figure.
func evictFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil { // dirty pages are not dropped
		return fmt.Errorf("sync %s: %w", path, err)
	}
	const fadvDontNeed = 4 // POSIX_FADV_DONTNEED
	if _, _, errno := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, fadvDontNeed, 0, 0); errno != 0 {
		return fmt.Errorf("fadvise %s: %w", path, errno)
	}
	return nil
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
	if err := agenttest.Grant(ctx, admin, name, ns, name); err != nil {
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
