// Command demo tells gpuhealth's story on a real, local cluster: `make demo`.
//
// It starts etcd, kube-apiserver, kube-scheduler (with `gpuhealth extender` configured) and
// kube-controller-manager on 127.0.0.1, and three real kubelet nodes (v1.37.2, fake CRI runtime,
// in the harness's node network) with 8 simulated GPUs each. On every node `gpuhealth
// device-plugin` registers with the real kubelet (so nvidia.com/gpu allocatable is the kubelet's
// own count of healthy GPUs) and a DRA kubelet plugin serves the gpu.nvidia.com ResourceSlices;
// a real `gpuhealth agent` per node reports health on every path. It replays
// examples/demo-scenario.yaml on the first node (a GPU falls off the bus, another overheats and
// recovers), drains a GPU of the second node as an operator would, submits pods through both
// scheduler paths (DRA claims and nvidia.com/gpu requests), and prints what happens: the status
// table as it changes, the kubelets' allocatable, where each pod landed and why, and which pods
// the kubelets run. Everything it started is stopped at the end, also on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

const (
	gpusPerNode = 8
	namespace   = "demo"
	waitLimit   = 90 * time.Second
)

var nodes = []string{"demo-node-0", "demo-node-1", "demo-node-2"}

// The GPU the demo repairs, and the one beside it that a reset does not cure: a fault only an
// active test finds (NVSentinel #695), which its validation catches.
const (
	repairNode = "demo-node-2"
	repairGPU  = 7
	latentGPU  = 6
)

func main() {
	bin := flag.String("gpuhealth", "bin/gpuhealth", "the gpuhealth binary")
	scenario := flag.String("scenario", "examples/demo-scenario.yaml", "scenario replayed on "+nodes[0])
	backend := flag.String("backend", "sim", "sim: the agents and device plugins simulate their GPUs; nvml: they read a simulated NVIDIA driver per node (gpuhealth sim-driver) through NVML, as in production")
	flag.Parse()
	if *backend != "sim" && *backend != "nvml" {
		fmt.Fprintf(os.Stderr, "demo: --backend must be sim or nvml, got %q\n", *backend)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *bin, *scenario, *backend == "nvml")
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// story prints numbered chapters.
type story struct {
	out     io.Writer
	start   time.Time
	chapter int
}

func (s *story) say(format string, args ...any) {
	fmt.Fprintf(s.out, "[%5.1fs] %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *story) heading(title string) {
	s.chapter++
	fmt.Fprintf(s.out, "\n=== %d. %s\n", s.chapter, title)
}

func run(ctx context.Context, bin, scenarioPath string, onDriver bool) error {
	st := &story{out: os.Stdout, start: time.Now()}
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	sc, err := sim.LoadScenario(scenarioPath)
	if err != nil {
		return err
	}
	if sc.Node != nodes[0] {
		return fmt.Errorf("%s: node must be %s", scenarioPath, nodes[0])
	}

	st.heading("A local control plane")
	st.say("finding or building etcd and Kubernetes %s (the first run builds them: about 10 minutes)", controlplane.KubernetesVersion)
	binDir, err := controlplane.FindBinDir(ctx)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	extenderAddr := ln.Addr().String()
	ln.Close()
	c, err := controlplane.Start(ctx, controlplane.Options{
		BinDir:      binDir,
		NodeNetwork: true,
		SchedulerConfigExtra: fmt.Sprintf(`extenders:
- urlPrefix: "http://%s"
  filterVerb: filter
  prioritizeVerb: prioritize
  weight: 5
  nodeCacheCapable: true
  httpTimeout: 10s
  managedResources:
  - name: nvidia.com/gpu
    ignoredByScheduler: false
`, extenderAddr),
	})
	if err != nil {
		return err
	}
	var procs []*exec.Cmd
	var draPlugins []*controlplane.DRAPlugin
	driverRoots := map[string]string{} // node -> its simulated driver's root (--backend nvml)
	defer func() {
		for _, p := range slices.Backward(procs) {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
		for _, root := range driverRoots {
			_ = os.RemoveAll(root)
		}
		for _, p := range draPlugins {
			p.Stop()
		}
		_ = c.Stop()
		st.say("stopped every process the demo started")
	}()
	st.say("etcd, kube-apiserver, kube-scheduler and kube-controller-manager are up at %s", c.Host())

	admin := c.Admin()
	logDir, err := os.MkdirTemp("", "gpuhealth-demo-")
	if err != nil {
		return err
	}
	st.heading("Three GPU nodes, 8 GPUs each")
	kubeletNodes, err := setUpNodes(ctx, c, admin)
	if err != nil {
		return err
	}
	for _, n := range kubeletNodes {
		p, err := c.StartDRAPlugin(ctx, n)
		if err != nil {
			return err
		}
		draPlugins = append(draPlugins, p)
	}
	st.say("real kubelets run %s (addresses %s..%s in the node network); each has DRA ResourceSlices (driver gpu.nvidia.com) and a DRA kubelet plugin",
		strings.Join(nodes, ", "), kubeletNodes[0].IP, kubeletNodes[len(kubeletNodes)-1].IP)

	started := map[string]*exec.Cmd{}
	start := func(name string, args ...string) error {
		logFile, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		procs = append(procs, cmd)
		started[name] = cmd
		return nil
	}
	kubeconfig := c.AdminKubeconfig()
	if err := start("extender", "extender", "--insecure", "--listen-address", extenderAddr, "--kubeconfig", kubeconfig); err != nil {
		return err
	}
	config := filepath.Join(logDir, "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"), 0o644); err != nil {
		return err
	}
	// On the simulated driver each node's NVML holders are an agent and a device plugin; a reset
	// is refused while the other one holds the GPUs, as on a real node.
	devicePlugins := map[string][]string{}
	for i, node := range nodes {
		scenario := scenarioPath
		if i > 0 {
			scenario = filepath.Join(logDir, node+".yaml")
			body := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: %d}\nevents: []\n", node, gpusPerNode)
			if err := os.WriteFile(scenario, []byte(body), 0o644); err != nil {
				return err
			}
		}
		// The agents repair GPUs (docs/remediation.md), asking their kubelet which pods hold a GPU.
		// Every repaired GPU is tested before it goes back (docs/remediation.md, "Verify before
		// return"): by the simulator's own diagnostic, or on the driver by its dcgmi.
		remediation := fmt.Sprintf("remediation: {enabled: true, probation: 10s, maxConcurrent: 2, namespace: default, podResourcesSocket: %q", kubeletNodes[i].PodResourcesSocket())
		validation := "validation: {enabled: true, probation: 5s}"
		agentScenario := scenario
		if node == repairNode {
			// The agent's GPU 7 needs a reset; the device plugin's simulation stays clean, as a
			// real device plugin would see the GPU healthy again after the reset.
			agentScenario = filepath.Join(logDir, node+".agent.yaml")
			body := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: {count: %d}\nevents:\n  - {at: 3s, gpu: %d, xid: 48}\n"+
				"  - {at: 3s, gpu: %d, latent: {xid: 48}}\n  - {at: 3s, gpu: %d, xid: 48}\n", node, gpusPerNode, repairGPU, latentGPU, latentGPU)
			if err := os.WriteFile(agentScenario, []byte(body), 0o644); err != nil {
				return err
			}
		}
		agentSource := []string{"--backend", "sim", "--scenario", agentScenario}
		pluginSource := []string{"--backend", "sim", "--scenario", scenario}
		if onDriver {
			// One driver per node serves both; its faults come a few seconds after it starts,
			// once the agent and the device plugin watch them.
			if node == repairNode {
				scenario = agentScenario
			}
			root, err := serveDriver(ctx, start, logDir, node, scenario)
			if err != nil {
				return err
			}
			driverRoots[node] = root
			agentSource = []string{"--backend", "nvml", "--driver-root", root}
			pluginSource = agentSource
			// The agent resets a GPU through the simulated driver, as nvidia-smi --gpu-reset would.
			remediation += fmt.Sprintf(", maxAttempts: 5, resetCommand: [%q, sim-driver, inject, --driver-root, %q, \"{gpu: {uuid}, reset: true}\"]", bin, root)
			validation = fmt.Sprintf("validation: {enabled: true, probation: 5s, command: [%q, diag, -r, \"2\", -i, \"gpu:{dcgmID}\", -j]}", filepath.Join(root, "usr", "bin", "dcgmi"))
		}
		agentConfig := filepath.Join(logDir, node+".config.yaml")
		if err := os.WriteFile(agentConfig, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"+remediation+", "+validation+"}\n"), 0o644); err != nil {
			return err
		}
		if err := start("agent-"+node, append(append([]string{"agent"}, agentSource...), "--node-name", node,
			"--kubeconfig", kubeconfig, "--config", agentConfig, "--checkpoint", filepath.Join(logDir, node+".checkpoint"),
			"--metrics-address", "")...); err != nil {
			return err
		}
		devicePlugins[node] = append(append([]string{"device-plugin"}, pluginSource...), "--config", config,
			"--kubelet-socket-dir", kubeletNodes[i].DevicePluginDir(), "--checkpoint", filepath.Join(logDir, node+".device-plugin.checkpoint"))
		if err := start("device-plugin-"+node, devicePlugins[node]...); err != nil {
			return err
		}
	}
	if onDriver {
		st.say("each node has a simulated NVIDIA driver (libnvidia-ml.so.1 in %s ...) that its agent and device plugin read through NVML", driverRoots[nodes[0]])
	}
	st.say("each node runs an agent and a device plugin (simulated GPUs, the same faults); the scheduler extender listens on %s; logs in %s", extenderAddr, logDir)
	if err := waitFor(ctx, "every kubelet to count 8 GPUs from its device plugin", func() (bool, error) {
		for _, node := range nodes {
			n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			capacity := n.Status.Capacity[scheduling.ResourceGPU]
			if capacity.Value() != gpusPerNode {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	if err := sayAllocatable(ctx, st, admin); err != nil {
		return err
	}
	if err := waitFor(ctx, "every agent to report", func() (bool, error) {
		list, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		reported := 0
		for _, n := range list.Items {
			if n.Annotations[gpuhealthv1.HealthKey] != "" {
				reported++
			}
		}
		return reported == len(nodes), nil
	}); err != nil {
		return err
	}
	status := func(args ...string) error {
		cmd := exec.CommandContext(ctx, bin, append([]string{"status", "--kubeconfig", kubeconfig}, args...)...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	st.say("$ gpuhealth status --node %s", nodes[0])
	if err := status("--node", nodes[0]); err != nil {
		return err
	}

	st.heading("Faults on " + nodes[0])
	st.say("the scenario makes GPU 3 fall off the bus (XID 79) and GPU 5 overheat (97 °C), then cools GPU 5 down")
	if err := waitFor(ctx, "GPU 3 and GPU 5 of "+nodes[0]+" to be reported Unhealthy", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "3,5", err
	}); err != nil {
		return err
	}
	st.say("$ gpuhealth status --problems")
	if err := status("--problems"); err != nil {
		return err
	}
	if err := waitFor(ctx, "the kubelet of "+nodes[0]+" to count 6 healthy GPUs", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		allocatable := n.Status.Allocatable[scheduling.ResourceGPU]
		return allocatable.Value() == gpusPerNode-2, nil
	}); err != nil {
		return err
	}
	if err := sayAllocatable(ctx, st, admin); err != nil {
		return err
	}

	st.heading(fmt.Sprintf("A GPU reset repairs GPU %d of %s", repairGPU, repairNode))
	st.say("the agent of %s sees a double-bit ECC error (XID 48) on GPUs %d and %d: a GPU reset clears it, and each GPU is tested (validated) before it goes back", repairNode, repairGPU, latentGPU)
	// GPU 7's repair took at least one reset (two on the driver when the first was refused).
	attempts := 1
	if onDriver {
		// gpuhealth's own device plugin holds the node's GPUs open, and the driver refuses a
		// reset then, as NVIDIA's does (issue #29 has the agent pause such holders itself).
		if err := waitFor(ctx, "the first reset to be refused", func() (bool, error) {
			events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
			if err != nil {
				return false, err
			}
			for _, e := range events.Items {
				if e.Reason == "GPURemediationAttemptFailed" {
					msg := e.Message
					if i := strings.LastIndex(msg, "exit status 1: "); i >= 0 { // the driver's answer, not the whole command
						gpu, _, _ := strings.Cut(msg, " (")
						msg = fmt.Sprintf("%s: %s", gpu, msg[i+len("exit status 1: "):])
					}
					st.say("event %-28s %s", e.Reason, msg)
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			return err
		}
		st.say("the driver refused the reset: the device plugin of %s holds the GPUs; the operator stops it", repairNode)
		dp := started["device-plugin-"+repairNode]
		_ = dp.Process.Signal(syscall.SIGTERM)
		_ = dp.Wait()
		procs = slices.DeleteFunc(procs, func(c *exec.Cmd) bool { return c == dp })
	}
	if err := waitFor(ctx, "the repair of GPU 7", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, repairNode, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		r, err := gpuhealthv1.ParseRemediation(n.Annotations[gpuhealthv1.RemediationKey])
		uuid := sim.GPUUUID(repairNode, repairGPU)
		// The first reset may be refused (on the driver, while the device plugin holds the GPUs).
		return err == nil && r[uuid].Phase == "" && r[uuid].Attempts >= attempts, err
	}); err != nil {
		return err
	}
	if onDriver {
		// Its checkpoint still has the XID 48 a reset clears: a reset while it was stopped is
		// invisible to it (NVML keeps no record of one), so the operator starts it afresh.
		st.say("GPU 7 is reset; the operator starts the device plugin of %s again, without the checkpoint from before the reset", repairNode)
		args := slices.Clone(devicePlugins[repairNode])
		args[len(args)-1] += ".after-reset"
		if err := start("device-plugin-"+repairNode, args...); err != nil {
			return err
		}
		if err := waitFor(ctx, "the kubelet of "+repairNode+" to count 8 healthy GPUs again", func() (bool, error) {
			n, err := admin.CoreV1().Nodes().Get(ctx, repairNode, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			allocatable := n.Status.Allocatable[scheduling.ResourceGPU]
			return allocatable.Value() == gpusPerNode, nil
		}); err != nil {
			return err
		}
	}
	// GPU 6 was reset beside it, and a passive probation would have given it back: its
	// validation, an active test of that GPU alone, finds the fault the reset did not cure.
	latentUUID := sim.GPUUUID(repairNode, latentGPU)
	if err := waitFor(ctx, fmt.Sprintf("GPU %d's validation", latentGPU), func() (bool, error) {
		events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.Reason == "GPUValidationFailed" && strings.Contains(e.Message, latentUUID)
		}), nil
	}); err != nil {
		return err
	}
	events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + repairNode})
	if err != nil {
		return err
	}
	slices.SortFunc(events.Items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
	for _, e := range events.Items {
		if strings.HasPrefix(e.Reason, "GPURemediation") || strings.HasPrefix(e.Reason, "GPUValidation") {
			st.say("event %-28s %s", e.Reason, e.Message)
		}
	}
	st.say("GPU %d of %s was reset too and looked healthy, but its validation (DCGM's diagnostic of that GPU alone) failed: it stays out of service, where a passive probation would have given it back", latentGPU, repairNode)
	st.say("$ gpuhealth status --node %s", repairNode)
	if err := status("--node", repairNode); err != nil {
		return err
	}

	st.heading("An operator drains GPU 2 of " + nodes[1])
	cmd := exec.CommandContext(ctx, bin, "drain", nodes[1], "2", "--reason", "fan noise, RMA ticket 4711", "--kubeconfig", kubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}
	if err := waitFor(ctx, "the drain to reach the node's gpu-unhealthy-ids", func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[1], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "2", err
	}); err != nil {
		return err
	}
	st.say("$ gpuhealth status --problems -o wide")
	if err := status("--problems", "-o", "wide"); err != nil {
		return err
	}

	st.heading("Work arrives")
	if err := submitWork(ctx, st, admin); err != nil {
		return err
	}
	if err := sayRunning(ctx, st, admin); err != nil {
		return err
	}

	// GPU 5 cools down at the scenario's 25 s: the story says whether that happened already.
	recovered := func() (bool, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		return err == nil && n.Annotations[gpuhealthv1.UnhealthyIDsKey] == "3", err
	}
	if back, err := recovered(); err != nil {
		return err
	} else if back {
		st.heading("GPU 5 of " + nodes[0] + " has cooled down")
		st.say("GPU 5 is back already: Healthy again after three clean samples below its slowdown temperature")
	} else {
		st.heading("GPU 5 of " + nodes[0] + " cools down")
		if err := waitFor(ctx, "GPU 5 to recover after three clean samples", recovered); err != nil {
			return err
		}
	}
	st.say("$ gpuhealth status --problems")
	if err := status("--problems"); err != nil {
		return err
	}
	st.say("GPU 3 stays out until the node reboots; GPU 2 of %s until `gpuhealth undrain %s 2`", nodes[1], nodes[1])
	st.heading("The end")
	return nil
}

// taintedDevices names the DRA devices of node that gpuhealth's DeviceTaintRules keep work off
// now ("gpu-3, gpu-5"; "none" when there are none).
func taintedDevices(ctx context.Context, admin kubernetes.Interface, node string) (string, error) {
	rules, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel + "=" + node})
	if err != nil {
		return "", err
	}
	var names []string
	for _, r := range rules.Items {
		if sel := r.Spec.DeviceSelector; sel != nil && sel.Device != nil && r.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNone {
			names = append(names, *sel.Device)
		}
	}
	if len(names) == 0 {
		return "none", nil
	}
	slices.Sort(names)
	return strings.Join(names, ", "), nil
}

// driverLead is how long after its start a node's simulated driver plays its scenario's first
// instant: the agent and the device plugin watch the GPUs by then.
const driverLead = 5 * time.Second

// atField is a scenario event's `at`.
var atField = regexp.MustCompile(`\bat:\s*([0-9][0-9a-z.]*)`)

// serveDriver starts the node's simulated NVIDIA driver (gpuhealth sim-driver serve) on a fresh
// driver root, serving the scenario driverLead late, and returns the root once it serves.
func serveDriver(ctx context.Context, start func(string, ...string) error, logDir, node, scenario string) (string, error) {
	data, err := os.ReadFile(scenario)
	if err != nil {
		return "", err
	}
	var bad error
	shifted := atField.ReplaceAllStringFunc(string(data), func(m string) string {
		d, err := time.ParseDuration(atField.FindStringSubmatch(m)[1])
		if err != nil {
			bad = fmt.Errorf("%s: %w", scenario, err)
			return m
		}
		return "at: " + (d + driverLead).String()
	})
	if bad != nil {
		return "", bad
	}
	driverScenario := filepath.Join(logDir, node+".driver.yaml")
	if err := os.WriteFile(driverScenario, []byte(shifted), 0o644); err != nil {
		return "", err
	}
	root, err := os.MkdirTemp("", "gh-demo-") // short: the socket's path must fit 107 bytes
	if err != nil {
		return "", err
	}
	if err := start("sim-driver-"+node, "sim-driver", "serve", "--scenario", driverScenario, "--driver-root", root); err != nil {
		return "", err
	}
	return root, waitFor(ctx, "the simulated driver of "+node, func() (bool, error) {
		_, err := os.Stat(simdriver.SocketPath(root))
		return err == nil, nil
	})
}

// setUpNodes starts a real kubelet per node and publishes its GPUs' ResourceSlice (as NVIDIA's DRA
// driver would). nvidia.com/gpu capacity is left to the device plugins.
func setUpNodes(ctx context.Context, c *controlplane.Cluster, admin kubernetes.Interface) ([]*controlplane.KubeletNode, error) {
	if _, err := admin.ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := c.CreateNamespace(ctx, namespace); err != nil {
		return nil, err
	}
	var out []*controlplane.KubeletNode
	for _, name := range nodes {
		node, err := c.StartKubeletNode(ctx, name, controlplane.KubeletNodeOptions{Labels: map[string]string{"gpuhealth.dev/demo": "true"}})
		if err != nil {
			return nil, err
		}
		out = append(out, node)
		uuids := make([]string, gpusPerNode)
		for i := range uuids {
			uuids[i] = sim.GPUUUID(name, i)
		}
		if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(name, uuids...), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// sayAllocatable prints each kubelet's nvidia.com/gpu allocatable: the device plugins' healthy
// count as the kubelet's device manager sees it.
func sayAllocatable(ctx context.Context, st *story, admin kubernetes.Interface) error {
	var parts []string
	for _, node := range nodes {
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		capacity, allocatable := n.Status.Capacity[scheduling.ResourceGPU], n.Status.Allocatable[scheduling.ResourceGPU]
		parts = append(parts, fmt.Sprintf("%s %d/%d", node, allocatable.Value(), capacity.Value()))
	}
	st.say("kubelets' nvidia.com/gpu allocatable/capacity: %s", strings.Join(parts, ", "))
	return nil
}

// sayRunning waits for the kubelets to run every scheduled pod and prints which run where.
func sayRunning(ctx context.Context, st *story, admin kubernetes.Interface) error {
	var running []string
	err := waitFor(ctx, "the kubelets to run the scheduled pods", func() (bool, error) {
		pods, err := admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running = running[:0]
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" {
				continue
			}
			if p.Status.Phase != corev1.PodRunning {
				return false, nil
			}
			running = append(running, p.Name+"@"+p.Spec.NodeName)
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	slices.Sort(running)
	st.say("Running (phase from the kubelets, which prepared the DRA claims and called the device plugins' Allocate): %s", strings.Join(running, ", "))
	return nil
}

// submitWork sends pods down both scheduler paths and tells where each landed and why.
func submitWork(ctx context.Context, st *story, admin kubernetes.Interface) error {
	// The DRA path: claims for one GPU each, on the node with the faults. The stock scheduler
	// skips the tainted devices: the story names those tainted when the claims were made.
	tainted, err := taintedDevices(ctx, admin, nodes[0])
	if err != nil {
		return err
	}
	for i := range 2 {
		name := fmt.Sprintf("dra-job-%d", i)
		claim := controlplane.GPUClaim(namespace, name)
		if _, err := admin.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return err
		}
		pod := controlplane.PodWithClaims(namespace, name, name)
		pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: nodes[0]}
		if _, err := admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	// The device-plugin path: whole-GPU requests that the extender filters by healthy GPUs.
	wholeGPU := []struct {
		name string
		gpus int64
	}{{"train-8-gpus", 8}, {"train-7-gpus", 7}, {"infer-6-gpus", 6}, {"train-8-gpus-too", 8}}
	for _, w := range wholeGPU {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: w.name},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{scheduling.ResourceGPU: *resource.NewQuantity(w.gpus, resource.DecimalSI)}}}}},
		}
		if _, err := admin.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		// One at a time, so the story reads in order.
		if err := waitFor(ctx, "the scheduler to decide on "+w.name, func() (bool, error) {
			p, err := admin.CoreV1().Pods(namespace).Get(ctx, w.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			return p.Spec.NodeName != "" || unschedulable(p) != "", nil
		}); err != nil {
			return err
		}
	}
	names := []string{"dra-job-0", "dra-job-1"}
	for _, w := range wholeGPU {
		names = append(names, w.name)
	}
	if err := waitFor(ctx, "the DRA pods to be scheduled", func() (bool, error) {
		for _, n := range names[:2] {
			p, err := admin.CoreV1().Pods(namespace).Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Spec.NodeName == "" {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	nodeList, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// What earlier pods hold, so each placement is explained as the scheduler saw it.
	used := map[string]*scheduling.Usage{}
	for _, n := range nodes {
		used[n] = &scheduling.Usage{}
	}
	for _, name := range names {
		p, err := admin.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		switch {
		case strings.HasPrefix(name, "dra-"):
			claim, err := admin.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			st.say("%-18s -> %s, device %s: kube-scheduler's DRA allocator skips the devices gpuhealth tainted (%s)", name, p.Spec.NodeName, allocated(claim), tainted)
		case p.Spec.NodeName != "":
			st.say("%-18s -> %s: %s", name, p.Spec.NodeName, why(p, nodeList.Items, used))
			if hold, ok, _ := scheduling.PodHold(p); ok {
				used[p.Spec.NodeName].Add(hold)
			}
		default:
			st.say("%-18s -> Pending: %s", name, why(p, nodeList.Items, used))
		}
	}
	return nil
}

func allocated(claim *resourcev1.ResourceClaim) string {
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) == 0 {
		return "<none>"
	}
	return claim.Status.Allocation.Devices.Results[0].Device
}

// why explains a placement with the extender's own placement logic: what every node offered.
func why(pod *corev1.Pod, nodes []corev1.Node, used map[string]*scheduling.Usage) string {
	req := scheduling.PodRequest(pod)
	var parts []string
	for i := range nodes {
		n, _ := scheduling.ParseNode(&nodes[i])
		u := used[n.Name]
		if fits, reason := scheduling.Filter(req, &n, *u); !fits {
			parts = append(parts, fmt.Sprintf("%s: %s", n.Name, reason))
		} else {
			parts = append(parts, fmt.Sprintf("%s: fits (%d healthy GPUs free)", n.Name, int64(n.WholeGPUs-n.Unhealthy)-u.GPUs))
		}
	}
	return fmt.Sprintf("needs %d GPUs; %s", req.GPUs, strings.Join(parts, "; "))
}

func unschedulable(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return c.Message
		}
	}
	return ""
}

func waitFor(ctx context.Context, what string, cond func() (bool, error)) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, waitLimit, true, func(context.Context) (bool, error) { return cond() })
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", what, err)
	}
	return nil
}
