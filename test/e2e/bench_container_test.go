//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/gpuhealth/gpuhealth/hack/bench/figure"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// TestBenchAgentContainerMemory measures the agent as users run it: the chart's DaemonSet pod, in
// a container on a real kubelet node with containerd, 8 simulated GPUs published in a
// ResourceSlice, idle and under an XID storm. Each scenario's pod runs until Ready, 2 s more,
// then a window (GPUHEALTH_BENCH_WINDOW, default 15 s, as hack/bench's /proc measurement); at its
// end the test reads the container's memory three ways: the kubelet's stats summary (the
// working set that eviction and `kubectl top` use), the container's cgroup, and /proc of the
// agent's process. hack/bench (`make bench`) runs it and renders the figures it writes to
// GPUHEALTH_BENCH_OUT; without that variable it runs the idle scenario only, so that CI keeps it
// working, and checks that the three views agree with each other.
func TestBenchAgentContainerMemory(t *testing.T) {
	skipWithoutContainers(t)
	t.Parallel()
	window := 15 * time.Second
	if v := os.Getenv("GPUHEALTH_BENCH_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("GPUHEALTH_BENCH_WINDOW=%q: want a positive duration", v)
		}
		window = d
	}
	stormRate := 100000
	if v := os.Getenv("GPUHEALTH_BENCH_STORM_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("GPUHEALTH_BENCH_STORM_RATE=%q: want a positive number", v)
		}
		stormRate = n
	}
	out := os.Getenv("GPUHEALTH_BENCH_OUT")
	scenarios := []string{figure.ScenarioIdle}
	if out != "" {
		scenarios = append(scenarios, figure.ScenarioStorm)
	}

	c, n, _ := startContainerdNode(t)
	ctx := t.Context()
	uuids := make([]string, 8)
	for i := range uuids {
		uuids[i] = simUUID(n.Name, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var figs []figure.Figure
	for _, scenario := range scenarios {
		path := filepath.Join(t.TempDir(), scenario+".yaml")
		if err := os.WriteFile(path, []byte(containerScenario(scenario, stormRate, window)), 0o600); err != nil {
			t.Fatal(err)
		}
		release := helm.Options{
			Release: "gpuhealth", Namespace: "gpuhealth-system",
			Values:  []string{"deployments/helm/gpuhealth/ci/local-values.yaml"},
			SetFile: []string{"agent.sim.scenario=" + path},
		}
		if out, err := helm.Install(ctx, c.AdminKubeconfig(), release, "3m"); err != nil {
			t.Fatalf("helm install (%s): %v\n%s", scenario, err, out)
		}
		m := measureAgentContainer(t, c, n, release.Namespace, window)
		t.Logf("%s: kubelet working set %.1f MiB, rss %.1f MiB, usage %.1f MiB; cgroup usage %.1f MiB (anonymous %.1f, page cache %.1f, peak %.1f); "+
			"/proc RSS %.1f MiB (anonymous %.1f, file-backed %.1f); CPU %.1f%% of a core",
			scenario, m[figure.ContainerWorkingSet]/1024, m[figure.ContainerRSS]/1024, m[figure.ContainerUsage]/1024,
			m[figure.CgroupUsage]/1024, m[figure.CgroupAnon]/1024, m[figure.CgroupFile]/1024, m[figure.CgroupPeak]/1024,
			m[figure.ContainerProcRSS]/1024, m[figure.ContainerProcAnon]/1024, m[figure.ContainerProcFile]/1024, m[figure.ContainerCPU])
		checkContainerViews(t, scenario, m)
		for name, v := range m {
			unit := figure.UnitKiB
			if name == figure.ContainerCPU {
				unit = figure.UnitCPU
			}
			figs = append(figs, figure.Figure{Name: name, Labels: map[string]string{figure.LabelScenario: scenario}, Unit: unit, Value: v})
		}
		if out, err := helm.Uninstall(ctx, c.AdminKubeconfig(), release, "2m"); err != nil {
			t.Fatalf("helm uninstall (%s): %v\n%s", scenario, err, out)
		}
		waitNoAgentPod(t, c, release.Namespace)
	}
	if out != "" {
		if err := figure.WriteFile(out, figs...); err != nil {
			t.Fatal(err)
		}
	}
}

// containerScenario is hack/bench's agent scenario: 8 GPUs with no events (idle), or each of the
// 8 sent XID 13 (counted; the GPU stays Healthy) stormRate/8 times a second in bursts every
// 100 ms, for longer than the measurement.
func containerScenario(kind string, stormRate int, window time.Duration) string {
	var b strings.Builder
	b.WriteString("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: any\ngpus: {count: 8}\n")
	if kind == figure.ScenarioIdle {
		return b.String()
	}
	repeat := max(1, stormRate/8/10)
	b.WriteString("events:\n")
	for at := time.Duration(0); at < window+time.Minute; at += 100 * time.Millisecond {
		for g := range 8 {
			fmt.Fprintf(&b, "  - {at: %dms, gpu: %d, xid: 13, repeat: %d}\n", at.Milliseconds(), g, repeat)
		}
	}
	return b.String()
}

// measureAgentContainer waits for the node's agent pod to be Ready, lets it run 2 s more and then
// window, and returns its figures (memory in KiB, CPU in percent of a core).
func measureAgentContainer(t *testing.T, c *controlplane.Cluster, n *controlplane.KubeletNode, ns string, window time.Duration) map[string]float64 {
	t.Helper()
	ctx := t.Context()
	var pod *corev1.Pod
	eventuallyWithin(t, 2*pollTimeout, "a Ready agent pod on "+n.Name, func(ctx context.Context) (bool, string, error) {
		pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: agentPodSelector})
		if err != nil {
			return false, "", err
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; podReady(p) && p.DeletionTimestamp == nil {
				pod = p
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("%d agent pods, none Ready", len(pods.Items)), nil
	})
	var containerID string
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == "agent" {
			_, containerID, _ = strings.Cut(s.ContainerID, "://")
		}
	}
	if containerID == "" {
		t.Fatalf("pod %s has no running agent container: %+v", pod.Name, pod.Status.ContainerStatuses)
	}
	cg, err := findContainerCgroup(containerID)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // past the start-up reconcile, as hack/bench's /proc measurement
	cpu0, err := cg.cpu()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	cpu1, err := cg.cpu()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]float64{figure.ContainerCPU: 100 * (cpu1 - cpu0).Seconds() / time.Since(start).Seconds()}
	if err := cg.memory(m); err != nil {
		t.Fatal(err)
	}
	pids, err := cg.pids()
	if err != nil || len(pids) != 1 {
		t.Fatalf("the agent container's cgroup %s holds processes %v (%v), want the agent alone", cg.memoryDir, pids, err)
	}
	if err := procMemory(pids[0], m); err != nil {
		t.Fatal(err)
	}
	// The kubelet's figures come from its stats provider's last housekeeping; wait for one
	// taken after the window began.
	eventuallyWithin(t, 2*pollTimeout, "kubelet stats of "+pod.Name+" newer than the window", func(ctx context.Context) (bool, string, error) {
		raw, err := c.Admin().CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy/stats/summary").
			Param("only_cpu_and_memory", "true").DoRaw(ctx)
		if err != nil {
			return false, "", err
		}
		var summary statsv1alpha1.Summary
		if err := json.Unmarshal(raw, &summary); err != nil {
			return false, "", err
		}
		for _, ps := range summary.Pods {
			if ps.PodRef.UID != string(pod.UID) {
				continue
			}
			for _, cs := range ps.Containers {
				mem := cs.Memory
				if cs.Name != "agent" || mem == nil || mem.WorkingSetBytes == nil || mem.RSSBytes == nil || mem.UsageBytes == nil {
					continue
				}
				if mem.Time.Time.Before(start) {
					return false, "stats from " + mem.Time.Format(time.RFC3339), nil
				}
				m[figure.ContainerWorkingSet] = float64(*mem.WorkingSetBytes) / 1024
				m[figure.ContainerRSS] = float64(*mem.RSSBytes) / 1024
				m[figure.ContainerUsage] = float64(*mem.UsageBytes) / 1024
				return true, "", nil
			}
		}
		return false, "no memory stats of the agent container yet", nil
	})
	return m
}

// agentPodSelector selects the chart's agent pods.
var agentPodSelector = labels.Set{"app.kubernetes.io/instance": "gpuhealth", "app.kubernetes.io/component": "agent"}.String()

// checkContainerViews checks what must hold between the three views, whatever the figures: the
// kubelet's and the cgroup's anonymous memory are one counter read at different times, so they
// agree within the window's drift; a working set never exceeds usage; the process's own anonymous
// memory is charged to its cgroup.
func checkContainerViews(t *testing.T, scenario string, m map[string]float64) {
	t.Helper()
	for name, v := range m {
		if v <= 0 && name != figure.CgroupFile {
			t.Errorf("%s: %s = %v, want > 0", scenario, name, v)
		}
	}
	if m[figure.ContainerWorkingSet] > m[figure.ContainerUsage] {
		t.Errorf("%s: kubelet working set %.0f KiB exceeds usage %.0f KiB", scenario, m[figure.ContainerWorkingSet], m[figure.ContainerUsage])
	}
	if m[figure.ContainerProcAnon] > 1.5*m[figure.CgroupAnon]+1024 {
		t.Errorf("%s: the process's anonymous memory (%.0f KiB) is not charged to its cgroup (%.0f KiB anonymous)", scenario, m[figure.ContainerProcAnon], m[figure.CgroupAnon])
	}
}

// waitNoAgentPod waits until helm uninstall's agent pods are gone, so that the next scenario's
// pod is the only one.
func waitNoAgentPod(t *testing.T, c *controlplane.Cluster, ns string) {
	t.Helper()
	eventuallyWithin(t, 2*pollTimeout, "no agent pod left", func(ctx context.Context) (bool, string, error) {
		pods, err := c.Admin().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: agentPodSelector})
		if err != nil {
			return false, "", err
		}
		return len(pods.Items) == 0, fmt.Sprintf("%d agent pods", len(pods.Items)), nil
	})
}

// containerCgroup is a container's cgroup: its memory (and, on v1, cpuacct) directory.
type containerCgroup struct {
	v2                bool
	memoryDir, cpuDir string
}

// findContainerCgroup finds the cgroup of the container with id, wherever the runtime's cgroup
// parent put it (cgroup v1's memory hierarchy, or v2's unified one).
func findContainerCgroup(id string) (containerCgroup, error) {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir, err := findDir("/sys/fs/cgroup", id)
		return containerCgroup{v2: true, memoryDir: dir, cpuDir: dir}, err
	}
	mem, err := findDir("/sys/fs/cgroup/memory", id)
	if err != nil {
		return containerCgroup{}, err
	}
	cpu, err := findDir("/sys/fs/cgroup/cpuacct", id)
	return containerCgroup{memoryDir: mem, cpuDir: cpu}, err
}

// findDir returns the first directory under root whose name contains name (the ID alone with
// cgroupfs, cri-containerd-ID.scope with systemd).
func findDir(root, name string) (string, error) {
	var found string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil // cgroups come and go while we walk
		}
		if strings.Contains(d.Name(), name) {
			found = path
			return fs.SkipAll
		}
		return nil
	})
	if err == nil && found == "" {
		err = fmt.Errorf("no cgroup of container %s under %s", name, root)
	}
	return found, err
}

// cpu is the cgroup's CPU time so far.
func (cg containerCgroup) cpu() (time.Duration, error) {
	if cg.v2 {
		stat, err := readKeyed(filepath.Join(cg.cpuDir, "cpu.stat"))
		return time.Duration(stat["usage_usec"]) * time.Microsecond, err
	}
	v, err := readNumber(filepath.Join(cg.cpuDir, "cpuacct.usage"))
	return time.Duration(v), err
}

// memory adds the cgroup's memory figures (KiB) to m.
func (cg containerCgroup) memory(m map[string]float64) error {
	usageFile, peakFile, anonKey, fileKey := "memory.usage_in_bytes", "memory.max_usage_in_bytes", "rss", "cache"
	if cg.v2 {
		usageFile, peakFile, anonKey, fileKey = "memory.current", "memory.peak", "anon", "file"
	}
	usage, err := readNumber(filepath.Join(cg.memoryDir, usageFile))
	if err != nil {
		return err
	}
	peak, err := readNumber(filepath.Join(cg.memoryDir, peakFile))
	if err != nil {
		return err
	}
	stat, err := readKeyed(filepath.Join(cg.memoryDir, "memory.stat"))
	if err != nil {
		return err
	}
	m[figure.CgroupUsage] = float64(usage) / 1024
	m[figure.CgroupPeak] = float64(peak) / 1024
	m[figure.CgroupAnon] = float64(stat[anonKey]) / 1024
	m[figure.CgroupFile] = float64(stat[fileKey]) / 1024
	return nil
}

// pids are the processes in the cgroup.
func (cg containerCgroup) pids() ([]int, error) {
	data, err := os.ReadFile(filepath.Join(cg.memoryDir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, err
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// procMemory adds the process's resident memory (KiB) from /proc/PID/status to m.
func procMemory(pid int, m map[string]float64) error {
	path := fmt.Sprintf("/proc/%d/status", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	names := map[string]string{"VmRSS": figure.ContainerProcRSS, "RssAnon": figure.ContainerProcAnon, "RssFile": figure.ContainerProcFile}
	for _, line := range strings.Split(string(data), "\n") {
		key, value, _ := strings.Cut(line, ":")
		name, ok := names[key]
		if !ok {
			continue
		}
		kib, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		if err != nil {
			return fmt.Errorf("%s: %q: %w", path, line, err)
		}
		m[name] = kib
		delete(names, key)
	}
	if len(names) > 0 {
		return fmt.Errorf("%s lacks %v", path, names)
	}
	return nil
}

// readNumber reads a cgroup file holding one number.
func readNumber(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
}

// readKeyed reads a cgroup file of "key value" lines.
func readKeyed(path string) (map[string]uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, line, err)
		}
		out[k] = n
	}
	return out, nil
}
