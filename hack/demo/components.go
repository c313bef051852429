package main

// The cluster's GPU nodes and what runs on them: kubelets, DRA plugins, agents, device plugins and
// (on the driver) simulated NVIDIA drivers.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// gpuNodes starts the three kubelet nodes with their DRA plugins.
func (d *demo) gpuNodes() error {
	ctx, st, admin, c := d.ctx, d.st, d.admin, d.c
	st.heading("Three GPU nodes, 8 GPUs each")
	kubeletNodes, err := setUpNodes(ctx, c, admin)
	d.kubeletNodes = kubeletNodes
	if err != nil {
		return err
	}
	for _, n := range kubeletNodes {
		p, err := c.StartDRAPlugin(ctx, n)
		if err != nil {
			return err
		}
		d.draPlugins = append(d.draPlugins, p)
	}
	st.say("real kubelets run %s (addresses %s..%s in the node network); each has DRA ResourceSlices (driver gpu.nvidia.com) and a DRA kubelet plugin",
		strings.Join(nodes, ", "), kubeletNodes[0].IP, kubeletNodes[len(kubeletNodes)-1].IP)

	return nil
}

// components starts the extender, and on each node an agent and a device plugin (and on the
// driver, a simulated NVIDIA driver), and waits until they report.
func (d *demo) components() error {
	ctx, st, admin, kubeconfig, logDir, start, status, onDriver, driverRoots, extenderAddr := d.ctx, d.st, d.admin, d.kubeconfig, d.logDir, d.start, d.status, d.onDriver, d.driverRoots, d.extenderAddr
	if err := start("extender", "extender", "--insecure", "--listen-address", extenderAddr, "--kubeconfig", kubeconfig, "--agent-namespace", config.DefaultBreakerNamespace); err != nil {
		return err
	}
	config := filepath.Join(logDir, "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"), 0o644); err != nil {
		return err
	}
	// On the simulated driver each node's NVML holders are an agent and a device plugin; a reset
	// is refused while the other one holds the GPUs, as on a real node.
	for i, node := range nodes {
		if err := d.startNode(i, node, config); err != nil {
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
	st.say("$ gpuhealth status --node %s", nodes[0])
	if err := status("--node", nodes[0]); err != nil {
		return err
	}

	return nil
}

// startNode starts node's agent and device plugin (and, on the driver, its simulated driver),
// each with its scenario and configuration; config is the device plugins' HealthConfig.
func (d *demo) startNode(i int, node, config string) error {
	ctx, bin, logDir, kubeconfig, kubeletNodes, scenarioPath, onDriver, start, driverRoots, devicePlugins := d.ctx, d.bin, d.logDir, d.kubeconfig, d.kubeletNodes, d.scenarioPath, d.onDriver, d.start, d.driverRoots, d.devicePlugins
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
	// The claimstatus reporter finds the claims of the node's pods through the same kubelet.
	claims := fmt.Sprintf("agent: {claimStatus: {podResourcesSocket: %q}}\n", kubeletNodes[i].PodResourcesSocket())
	if err := os.WriteFile(agentConfig, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"+claims+remediation+", "+validation+"}\n"), 0o644); err != nil {
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
	return nil
}

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
	// The workloads' namespace, and the agents' (their heartbeat Leases and remediation's
	// slots live there, as in the chart's release namespace).
	for _, ns := range []string{namespace, config.DefaultBreakerNamespace} {
		if _, err := c.CreateNamespace(ctx, ns); err != nil {
			return nil, err
		}
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
