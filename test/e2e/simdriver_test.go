//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// simDriverLibraries builds the simulated libnvidia-ml.so.1 of every profile into a directory
// of the test's (hack/sim-driver.sh).
func simDriverLibraries(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("hack/sim-driver.sh", dir)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/sim-driver.sh: %v\n%s", err, out)
	}
	return dir
}

// simDriver is a `gpuhealth sim-driver serve` the test runs: its driver root, and inject.
type simDriver struct {
	t    *testing.T
	root string
	proc *process
}

// startSimDriver serves gpus simulated GPUs named for node on root (the library in subdir, ""
// for the default), with the libraries built into libs, and waits until it listens.
func startSimDriver(t *testing.T, libs, root, subdir, node string, gpus int, version string) *simDriver {
	t.Helper()
	return startSimDriverGPUs(t, libs, root, subdir, node, fmt.Sprintf("{count: %d}", gpus), version)
}

// startSimDriverGPUs is startSimDriver with the scenario's gpus section as given ("{count: 4,
// migInstances: {\"1\": 2}}").
func startSimDriverGPUs(t *testing.T, libs, root, subdir, node, gpus, version string) *simDriver {
	t.Helper()
	dir := t.TempDir()
	scenario := filepath.Join(dir, "scenario.yaml")
	body := fmt.Sprintf("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: %s\ngpus: %s\n", node, gpus)
	if err := os.WriteFile(scenario, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"sim-driver", "serve", "--scenario", scenario, "--driver-root", root, "--library-dir", libs, "--driver-version", version}
	if subdir == "" {
		subdir = "usr/lib/x86_64-linux-gnu"
	} else {
		args = append(args, "--library-subdir", subdir)
	}
	sd := startProcess(t, "sim-driver", filepath.Join(dir, "sim-driver.log"), gpuhealthBinary(t), args...)
	eventually(t, "the simulated driver listening", func(context.Context) (bool, string, error) {
		if exited, log := sd.exited(); exited {
			return false, "", fmt.Errorf("sim-driver exited:\n%s", log)
		}
		_, err := os.Stat(filepath.Join(root, subdir, "gpuhealth-sim-driver.sock"))
		return err == nil, "", nil
	})
	return &simDriver{t: t, root: root, proc: sd}
}

// inject applies one event at once, through the command line as a user would.
func (d *simDriver) inject(ev string) {
	d.t.Helper()
	if out, err := exec.Command(gpuhealthBinary(d.t), "sim-driver", "inject", "--driver-root", d.root, ev).CombinedOutput(); err != nil {
		d.t.Fatalf("inject %s: %v\n%s", ev, err, out)
	}
}

// startNVMLAgent runs `gpuhealth agent --backend nvml` on the driver root for node, with
// agentConfig, a checkpoint and its metrics on a free loopback port; it returns the process and
// the metrics base URL.
func startNVMLAgent(t *testing.T, root, node, kubeconfig string) (*process, string) {
	t.Helper()
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, []byte(agentConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	agent := startProcess(t, "agent", filepath.Join(dir, "agent.log"), gpuhealthBinary(t), "agent", "--backend", "nvml",
		"--driver-root", root, "--node-name", node, "--kubeconfig", kubeconfig, "--config", configPath,
		"--checkpoint", filepath.Join(dir, "ckpt.json"), "--metrics-address", fmt.Sprintf("127.0.0.1:%d", port), "-v", "2")
	return agent, "http://127.0.0.1:" + strconv.Itoa(port)
}

// shortTempDir is a temporary directory with a short path: the simulator's socket path must fit
// a Unix socket's 107 bytes.
func shortTempDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// TestAgentOnTheSimulatedDriver runs the production path, `gpuhealth agent --backend nvml`,
// through go-nvml's real cgo path on the simulated driver, against a real API server: a fault
// injected at run time reaches the Volcano annotation, a DeviceTaintRule and the Node condition,
// and an uncorrectable ECC error injected next makes a second GPU Unhealthy.
func TestAgentOnTheSimulatedDriver(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "simdriver-node"
	gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)

	sd := startSimDriver(t, libs, shortTempDir(t, "sd-e2e-"), "", node, 4, "535")
	agent, metrics := startNVMLAgent(t, sd.root, node, kubeconfig)
	eventually(t, "agent ready on NVML", func(context.Context) (bool, string, error) {
		if exited, log := agent.exited(); exited {
			return false, "", fmt.Errorf("the agent exited:\n%s", log)
		}
		code, _ := httpGetStatus(metrics + "/readyz")
		body, _ := httpGet(metrics + "/metrics")
		up := strings.Contains(body, `gpuhealth_source_up{node="`+node+`",source="nvml"} 1`)
		return code == 200 && up, fmt.Sprintf("readyz %d, source_up nvml 1: %v", code, up), nil
	})

	sd.inject("{gpu: 2, xid: 79}")
	eventually(t, "XID 79 on GPU 2 in every sink", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		cond, err := nodeCondition(ctx, c, node, corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy))
		if err != nil {
			return false, "", err
		}
		return ann[gpuhealthv1.UnhealthyIDsKey] == "2" && len(rs) == 1 && cond.Status == corev1.ConditionTrue,
			fmt.Sprintf("ids=%q rules=%v condition=%s", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs), cond.Status), nil
	})
	// An uncorrectable ECC error on GPU 0, read by the sampler and by the event loop.
	sd.inject("{gpu: 0, ecc: {uncorrectedVolatile: 1}}")
	eventually(t, "GPU 0 unhealthy too", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		return err == nil && ann[gpuhealthv1.UnhealthyIDsKey] == "0,2", fmt.Sprintf("ids=%q", ann[gpuhealthv1.UnhealthyIDsKey]), err
	})

	// GPU 3 wedges: every call on it hangs. The sampler's round hangs with it, and once it has
	// run past three sample periods and the margin /healthz fails, so that the kubelet would
	// restart the agent; it answers again once the call returns.
	if code, err := httpGetStatus(metrics + "/healthz"); code != 200 {
		t.Fatalf("/healthz before the hang: %d %v", code, err)
	}
	sd.inject("{gpu: 3, hang: 45s}")
	eventuallyWithin(t, 90*time.Second, "/healthz failing on the hung call", func(context.Context) (bool, string, error) {
		code, _ := httpGetStatus(metrics + "/healthz")
		body, _ := httpGet(metrics + "/healthz")
		return code == 503 && strings.Contains(body, "sampling round has been in NVML"), fmt.Sprintf("%d %s", code, body), nil
	})
	eventuallyWithin(t, 90*time.Second, "/healthz ok once the call returned", func(context.Context) (bool, string, error) {
		code, err := httpGetStatus(metrics + "/healthz")
		return code == 200, fmt.Sprintf("%d %v", code, err), nil
	})
}

// TestRealNodeDevicePluginOnTheSimulatedDriver runs `gpuhealth device-plugin --backend nvml` on
// the simulated driver against a real kubelet: the kubelet's allocatable follows faults injected
// into the driver at run time; a reset is refused while the plugin holds the GPUs, and a GPU
// reset while it is stopped is back when it starts again.
func TestRealNodeDevicePluginOnTheSimulatedDriver(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	sd := startSimDriver(t, libs, shortTempDir(t, "sd-dp-"), "", node.Name, 8, "550")
	root, dir := sd.root, t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plugin := func(log string) *process {
		return startProcess(t, "device-plugin", filepath.Join(dir, log), gpuhealthBinary(t), "device-plugin", "--backend", "nvml",
			"--driver-root", root, "--config", configPath, "--kubelet-socket-dir", node.DevicePluginDir(), "-v", "4")
	}
	dp := plugin("device-plugin.log")
	waitGPUs(t, c, node.Name, 8, 8)

	sd.inject("{gpu: 3, lost: true}") // fallen off the bus: lost to every process, now and later
	sd.inject("{gpu: 5, ecc: {uncorrectedVolatile: 1}}")
	waitGPUs(t, c, node.Name, 8, 6)
	// While the plugin holds NVML the driver refuses the reset, as nvidia-smi --gpu-reset does.
	out, err := exec.Command(gpuhealthBinary(t), "sim-driver", "inject", "--driver-root", root, "{gpu: 5, reset: true}").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(string(out), "reset refused") {
		t.Fatalf("a reset while the device plugin holds the GPUs: %v\n%s", err, out)
	}
	// The administrator stops the plugin, resets the GPU and starts the plugin again.
	dp.stop(t)
	sd.inject("{gpu: 5, reset: true}")
	plugin("device-plugin-2.log")
	// GPU 5 is back; GPU 3, lost before the plugin started, cannot be named (every call on it
	// answers GPU_IS_LOST, its UUID too) and is no longer advertised.
	waitGPUs(t, c, node.Name, 7, 7)
}

// TestHelmChartProductionModeOnTheSimulatedDriver installs the chart in its production mode
// (backend nvml, mode hostMounts) on a containerd node whose driver root is the simulated driver,
// in both layouts users have: a driver on the host (library in usr/lib/x86_64-linux-gnu) and the
// GPU operator's driver container (/run/nvidia/driver, library in usr/lib64). The agent
// container loads the library from /driver-root with the image's own glibc, turns Ready on NVML,
// and reports a fault injected into the driver at run time; the device-plugin container changes
// the kubelet's allocatable.
func TestHelmChartProductionModeOnTheSimulatedDriver(t *testing.T) {
	skipWithoutContainers(t)
	t.Parallel()
	libs := simDriverLibraries(t)
	for _, layout := range []struct{ name, hostDir, subdir string }{
		{"driver on the host", "", "usr/lib/x86_64-linux-gnu"},
		{"GPU operator driver root", "run/nvidia/driver", "usr/lib64"},
	} {
		t.Run(layout.name, func(t *testing.T) {
			chartOnSimulatedDriver(t, libs, layout.hostDir, layout.subdir)
		})
	}
}

func chartOnSimulatedDriver(t *testing.T, libs, hostDir, subdir string) {
	c, n, _ := startContainerdNode(t)
	ctx := t.Context()
	uuids := make([]string, 4)
	for i := range uuids {
		uuids[i] = simUUID(n.Name, i)
	}
	if _, err := c.Admin().ResourceV1().ResourceSlices().Create(ctx, controlplane.GPUResourceSlice(n.Name, uuids...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node's driver root, on the host as / or the GPU operator's /run/nvidia/driver is
	// (under a directory of the test's: the machine's own /run/nvidia stays alone).
	base := shortTempDir(t, "sd-chart-")
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, hostDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sd := startSimDriver(t, libs, root, subdir, n.Name, 4, "550")
	release := helm.Options{
		Release: "gpuhealth", Namespace: "gpuhealth-system",
		Values: []string{"deployments/helm/gpuhealth/ci/local-values.yaml"},
		Set: []string{"agent.backend=nvml", "agent.nvml.mode=hostMounts", "agent.nvml.driverRoot=" + root,
			"agent.devicePlugin.enabled=true", "config.kernelLog.enabled=false"},
	}
	if out, err := helm.Install(ctx, c.AdminKubeconfig(), release, "3m"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	waitGPUs(t, c, n.Name, 4, 4)
	sd.inject("{gpu: 1, xid: 79}")
	waitNodeFault(t, c, n.Name)
	eventually(t, "a DeviceTaintRule for GPU 1", func(ctx context.Context) (bool, string, error) {
		rs, err := rules(ctx, c, n.Name)
		return err == nil && len(rs) == 1, fmt.Sprintf("rules %v", ruleNames(rs)), err
	})
	waitGPUs(t, c, n.Name, 4, 3)
}
