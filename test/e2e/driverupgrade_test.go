//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAgentReleasesNVMLForADriverUpgrade runs `gpuhealth agent --backend nvml` on the simulated
// driver against a real API server, with a sticky fault (XID 79 on GPU 2), through the two ways
// a driver goes away under it:
//
//  1. The GPU operator's driver manager pauses GPU clients (a nvidia.com/gpu.deploy.* label set
//     to paused-for-driver-upgrade): the agent releases NVML, and from /proc it holds no file of
//     the driver root; the driver can then be unloaded (the simulator refuses that while any
//     process holds NVML, as rmmod does), and is replaced by another version. Once the label is
//     back the agent attaches to the new driver.
//  2. Without any label, the driver is replaced under the agent by another version again: NVML
//     answers LIB_RM_VERSION_MISMATCH, and the agent re-attaches to the new library by itself.
//
// Through both the fault stays in every sink (annotation, DeviceTaintRule, no recovery Event),
// the agent's process is the same (it re-executes itself), and the GPUUnhealthy condition says
// Unknown, "released since", while the driver is away.
func TestAgentReleasesNVMLForADriverUpgrade(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "upgrade-node"
	gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)
	root := shortTempDir(t, "sd-up-")
	sd := startSimDriver(t, libs, root, "", node, 4, "535")
	agent, metrics := startNVMLAgent(t, root, node, kubeconfig)
	pid := agent.cmd.Process.Pid
	// onDriver waits until the agent is ready on NVML with the library of version loaded.
	onDriver := func(what, version string) {
		t.Helper()
		eventually(t, what, func(context.Context) (bool, string, error) {
			if exited, log := agent.exited(); exited {
				return false, "", fmt.Errorf("the agent exited:\n%s", log)
			}
			code, _ := httpGetStatus(metrics + "/readyz")
			body, _ := httpGet(metrics + "/metrics")
			up := strings.Contains(body, `gpuhealth_source_up{node="`+node+`",source="nvml"} 1`)
			held := driverFilesHeld(pid, root)
			loaded := strings.Contains(strings.Join(held, " "), "libnvidia-ml.so."+version)
			return code == 200 && up && loaded, fmt.Sprintf("readyz %d, source_up 1: %v, driver files held: %v", code, up, held), nil
		})
	}
	onDriver("the agent on driver 535", "535.261.03")

	sd.inject("{gpu: 2, xid: 79}")
	report := func(ctx context.Context) (string, corev1.NodeCondition, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return "", corev1.NodeCondition{}, err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return "", corev1.NodeCondition{}, err
		}
		cond, err := nodeCondition(ctx, c, node, nodecondition.Type)
		return fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), cond, err
	}
	var before string
	eventually(t, "XID 79 on GPU 2 in every sink", func(ctx context.Context) (bool, string, error) {
		var cond corev1.NodeCondition
		var err error
		before, cond, err = report(ctx)
		return err == nil && strings.HasPrefix(before, `ids="2" `) && strings.Contains(before, "gpu-") && cond.Status == corev1.ConditionTrue,
			before + " condition=" + string(cond.Status), err
	})
	// keptWhileAway checks that the driver being away changed nothing a scheduler reads, and
	// that the condition says the GPUs are unmonitored.
	keptWhileAway := func(what string) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, string, error) {
			now, cond, err := report(ctx)
			if err != nil {
				return false, "", err
			}
			if now != before {
				t.Fatalf("while the driver was away the report changed:\n before %s\n now    %s", before, now)
			}
			held := driverFilesHeld(pid, root)
			return cond.Status == corev1.ConditionUnknown && strings.Contains(cond.Message, "NVML released since") && len(held) == 0,
				fmt.Sprintf("condition %s %q, driver files held %v", cond.Status, cond.Message, held), nil
		})
	}

	// 1. The operator's driver manager pauses GPU clients.
	mergePatchNodeLabels(t, c, node, map[string]any{"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"})
	keptWhileAway("the agent to release NVML for the paused upgrade")
	sd.inject("{driver: unload}") // refused while any process holds NVML
	sd.proc.stop(t)
	sd = startSimDriver(t, libs, root, "", node, 4, "550")
	keptWhileAway("the agent to stay off NVML while the pause lasts")
	mergePatchNodeLabels(t, c, node, map[string]any{"nvidia.com/gpu.deploy.device-plugin": "true"})
	onDriver("the agent on the upgraded driver 550 once the pause ended", "550.163.01")
	checkFaultKept(t, c, node, report, before)

	// 2. The driver is replaced under the agent without a word from the operator.
	sd.proc.stop(t)
	startSimDriver(t, libs, root, "", node, 4, "535")
	onDriver("the agent on driver 535 after NVML answered the version mismatch", "535.261.03")
	checkFaultKept(t, c, node, report, before)
	if agent.cmd.Process.Pid != pid {
		t.Errorf("the agent's pid changed")
	}
	log, _ := os.ReadFile(agent.log)
	if n := strings.Count(string(log), "Released NVML: re-executing the agent"); n != 2 {
		t.Errorf("the agent released NVML %d times, want 2 (the pause, the version mismatch)", n)
	}
}

// checkFaultKept checks that every sink still carries the fault, the condition is True again,
// and no Event said the GPU recovered.
func checkFaultKept(t *testing.T, c *controlplane.Cluster, node string, report func(context.Context) (string, corev1.NodeCondition, error), before string) {
	t.Helper()
	eventually(t, "the fault in every sink after the driver came back", func(ctx context.Context) (bool, string, error) {
		now, cond, err := report(ctx)
		if err != nil {
			return false, "", err
		}
		if now != before {
			t.Fatalf("after the driver came back the report differs:\n before %s\n now    %s", before, now)
		}
		return cond.Status == corev1.ConditionTrue, fmt.Sprintf("condition %s %q", cond.Status, cond.Message), nil
	})
	recovered, err := c.Admin().CoreV1().Events("default").List(t.Context(), metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", node), fields.OneTermEqualSelector("reason", nodecondition.EventGPURecovered)).String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(recovered.Items) > 0 {
		t.Errorf("the GPU was reported recovered across the driver's absence: %s", recovered.Items[0].Message)
	}
}

// driverFilesHeld lists what process pid holds under root, from /proc: mapped files and open file
// descriptors.
func driverFilesHeld(pid int, root string) []string {
	var held []string
	if maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid)); err == nil {
		seen := map[string]bool{}
		for _, line := range strings.Split(string(maps), "\n") {
			if i := strings.Index(line, root); i >= 0 && !seen[line[i:]] {
				seen[line[i:]] = true
				held = append(held, "mapped "+line[i:])
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && strings.HasPrefix(target, root) {
			held = append(held, "open "+target)
		}
	}
	return held
}

// TestDevicePluginFollowsADriverUpgrade runs `gpuhealth device-plugin --backend nvml` on the
// simulated driver against a real kubelet, with XID 79 on GPU 5, through the two ways a driver
// goes away under it, and the kubelet's view never moves from 8 GPUs, 7 allocatable:
//
//  1. The GPU operator pauses GPU clients (its label on the Node the plugin watches): the plugin
//     shuts NVML down, so that the driver can be unloaded (the simulator refuses that while any
//     process holds NVML), and keeps serving its devices' last health; the driver comes back as
//     550 and the label goes back: a child process opens the new library, and the plugin
//     re-executes itself (same pid), restores the fault from its checkpoint and registers again.
//  2. 535 replaces 550 without a label: NVML answers LIB_RM_VERSION_MISMATCH, and the plugin
//     follows the same way.
func TestDevicePluginFollowsADriverUpgrade(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	kubeconfig := agentKubeconfig(t, c)
	root := shortTempDir(t, "sd-dpu-")
	sd := startSimDriver(t, libs, root, "", node.Name, 8, "535")
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, []byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\nsampleInterval: 1s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dp := startProcess(t, "device-plugin", filepath.Join(dir, "device-plugin.log"), gpuhealthBinary(t), "device-plugin", "--backend", "nvml",
		"--driver-root", root, "--config", configPath, "--kubelet-socket-dir", node.DevicePluginDir(),
		"--checkpoint", filepath.Join(dir, "ckpt.json"), "--kubeconfig", kubeconfig, "--node-name", node.Name, "-v", "2")
	pid := dp.cmd.Process.Pid
	onDriver := func(version string) {
		t.Helper()
		eventually(t, "the device plugin on the driver "+version, func(context.Context) (bool, string, error) {
			if exited, log := dp.exited(); exited {
				return false, "", fmt.Errorf("the device plugin exited:\n%s", log)
			}
			held := driverFilesHeld(pid, root)
			return strings.Contains(strings.Join(held, " "), "libnvidia-ml.so."+version), fmt.Sprintf("driver files held: %v", held), nil
		})
		waitGPUs(t, c, node.Name, 8, 7)
	}
	waitGPUs(t, c, node.Name, 8, 8)
	sd.inject("{gpu: 5, xid: 79}")
	waitGPUs(t, c, node.Name, 8, 7)

	// 1. The operator's pause: the driver can be unloaded once the plugin let go.
	mergePatchNodeLabels(t, c, node.Name, map[string]any{"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"})
	eventually(t, "the driver unloaded (the plugin let go of NVML)", func(context.Context) (bool, string, error) {
		out, err := exec.Command(gpuhealthBinary(t), "sim-driver", "inject", "--driver-root", root, "{driver: unload}").CombinedOutput()
		return err == nil, string(out), nil
	})
	waitGPUs(t, c, node.Name, 8, 7) // served all along
	sd.proc.stop(t)
	sd = startSimDriver(t, libs, root, "", node.Name, 8, "550")
	mergePatchNodeLabels(t, c, node.Name, map[string]any{"nvidia.com/gpu.deploy.device-plugin": "true"})
	onDriver("550.163.01")

	// 2. Another version without a label.
	sd.proc.stop(t)
	startSimDriver(t, libs, root, "", node.Name, 8, "535")
	onDriver("535.261.03")
	log, _ := os.ReadFile(dp.log)
	for _, want := range []string{"The GPU operator paused GPU clients", "The NVIDIA driver went away"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("the device plugin's log lacks %q", want)
		}
	}
	if n := strings.Count(string(log), "Re-executing the device plugin"); n != 2 {
		t.Errorf("the device plugin re-executed %d times, want 2", n)
	}
}

// TestAgentFollowsAMIGReconfiguration runs the agent on the simulated driver with GPU 1 in MIG
// mode (2 instances) and a sticky fault on GPU 0, and changes GPU 1's MIG layout under it, as
// mig-parted does: to 1 instance, then MIG off. Each time NVML's MIG configuration-change event
// makes the agent open NVML afresh (it re-executes itself: same pid, no restart of its pod): the
// instance that is gone leaves the gpu-health annotation, GPU 0 keeps its fault, nothing else
// changes.
func TestAgentFollowsAMIGReconfiguration(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "mig-node"
	gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)
	root := shortTempDir(t, "sd-mig-")
	sd := startSimDriverGPUs(t, libs, root, "", node, `{count: 4, migInstances: {"1": 2}}`, "550")
	agent, metrics := startNVMLAgent(t, root, node, kubeconfig)
	pid := agent.cmd.Process.Pid
	eventually(t, "the agent ready on NVML", func(context.Context) (bool, string, error) {
		code, err := httpGetStatus(metrics + "/readyz")
		return code == 200, fmt.Sprintf("readyz %d %v", code, err), nil
	})
	mig1, mig2 := sim.MIGUUID(node, 1, 1), sim.MIGUUID(node, 1, 2)
	// layout waits until the annotation lists exactly these MIG instances of GPU 1, with GPU 0
	// unhealthy (XID 79) and GPU 1 healthy.
	layout := func(what string, migs ...string) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, string, error) {
			if exited, log := agent.exited(); exited {
				return false, "", fmt.Errorf("the agent exited:\n%s", log)
			}
			ann, err := nodeAnnotations(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
			if err != nil {
				return false, "", err
			}
			var got []string
			for uuid, s := range sums {
				if s.ParentUUID != "" {
					got = append(got, uuid)
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(migs))
			return slices.Equal(got, want) && ann[gpuhealthv1.UnhealthyIDsKey] == "0",
				fmt.Sprintf("MIG instances %v (want %v), ids=%q", got, want, ann[gpuhealthv1.UnhealthyIDsKey]), nil
		})
	}
	sd.inject("{gpu: 0, xid: 79}")
	layout("GPU 0 unhealthy, GPU 1 with 2 MIG instances", mig1, mig2)
	sd.inject("{gpu: 1, migInstances: 1}")
	layout("GPU 1 with 1 MIG instance", mig1)
	sd.inject("{gpu: 1, migInstances: 0}")
	layout("GPU 1 out of MIG mode")
	if agent.cmd.Process.Pid != pid {
		t.Error("the agent's pid changed")
	}
	log, _ := os.ReadFile(agent.log)
	if n := strings.Count(string(log), "Re-executing the agent to watch the new MIG layout"); n != 2 {
		t.Errorf("the agent followed %d MIG changes, want 2", n)
	}
}
