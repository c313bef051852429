//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestRemediationBesideTheGPUOperatorsComponents: a GPU that needs a reset (XID 48) on the
// simulated driver, on a real kubelet node where a DaemonSet plays one of the GPU operator's
// components (DCGM: nodeSelector nvidia.com/gpu.deploy.dcgm=true) and a process holds NVML while
// its pod runs, as nv-hostengine does. The driver refuses a reset while it holds the GPU.
//
//  1. Without remediation.pauseOperatorComponents the agent does not try: the GPU waits, and the
//     Event names the component, its pod and the setting.
//  2. With it, the agent records the label, pauses it (paused-by-gpuhealth): the real DaemonSet
//     controller takes the pod away, the kubelet ends it, the holder goes with it; the agent
//     resets the GPU, gives the label back its value ("true"), and the DaemonSet brings the
//     component back. Each step is an Event.
func TestRemediationBesideTheGPUOperatorsComponents(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	start := time.Now()
	mark := func(what string) {
		t.Logf("%s: %v after the control plane", what, time.Since(start).Round(100*time.Millisecond))
	}
	ctx := t.Context()
	admin := c.Admin()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	mergePatchNodeLabels(t, c, node.Name, map[string]any{"nvidia.com/gpu.deploy.dcgm": "true"})
	root := shortTempDir(t, "sd-rc-")
	sd := startSimDriver(t, libs, root, "", node.Name, 4, "550")

	// The operator's DCGM, as its DaemonSet selects nodes.
	if _, err := c.CreateNamespace(ctx, "gpu-operator"); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "nvidia-dcgm"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "gpu-operator", Name: "nvidia-dcgm"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{"nvidia.com/gpu.deploy.dcgm": "true"},
					TerminationGracePeriodSeconds: new(int64),
					Containers:                    []corev1.Container{{Name: "nv-hostengine", Image: "gpuhealth.dev/e2e/workload:1"}},
				},
			},
		},
	}
	if _, err := admin.AppsV1().DaemonSets("gpu-operator").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dcgmPods := func(ctx context.Context) ([]string, error) {
		pods, err := admin.CoreV1().Pods("gpu-operator").List(ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node.Name).String()})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, p := range pods.Items {
			out = append(out, p.Name+"="+string(p.Status.Phase))
		}
		return out, nil
	}
	eventually(t, "the DCGM pod running on the node", func(ctx context.Context) (bool, string, error) {
		pods, err := dcgmPods(ctx)
		return len(pods) == 1 && strings.HasSuffix(pods[0], "=Running"), fmt.Sprint(pods), err
	})
	mark("DCGM running")
	dir := t.TempDir()
	// nv-hostengine's NVML session, for as long as its pod runs.
	hostengine := startProcess(t, "nv-hostengine", filepath.Join(dir, "hostengine.log"), gpuhealthBinary(t), "watch", "--backend", "nvml",
		"--driver-root", root, "--output", "json")

	kubeconfig := agentKubeconfig(t, c)
	remediationRBAC(t, c)
	configPath := filepath.Join(dir, "config.yaml")
	writeConfig := func(pause bool) {
		cfg := agentConfig + remediationConfig(3, 1, "-") +
			fmt.Sprintf("  resetCommand: [%q, sim-driver, inject, --driver-root, %q, \"{gpu: {uuid}, reset: true}\"]\n  pauseOperatorComponents: %v\n",
				gpuhealthBinary(t), root, pause)
		if err := os.WriteFile(configPath, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	agentArgs := []string{"agent", "--backend", "nvml", "--driver-root", root, "--node-name", node.Name, "--kubeconfig", kubeconfig,
		"--config", configPath, "--checkpoint", filepath.Join(dir, "state", "ckpt.json"), "--metrics-address", "", "-v", "2"}

	// 1. Not allowed to pause: the GPU waits, saying who holds it.
	writeConfig(false)
	first := startProcess(t, "agent", filepath.Join(dir, "agent-1.log"), gpuhealthBinary(t), agentArgs...)
	uuid := simUUID(node.Name, 1)
	eventually(t, "the agent on NVML", func(context.Context) (bool, string, error) {
		if exited, log := first.exited(); exited {
			return false, "", fmt.Errorf("the agent exited:\n%s", log)
		}
		b, _ := os.ReadFile(first.log)
		return strings.Contains(string(b), "Agent started"), "", nil
	})
	sd.inject("{gpu: 1, xid: 48}")
	eventually(t, "the GPU waiting, held by the operator's DCGM", func(ctx context.Context) (bool, string, error) {
		ev, err := remediationEvents(ctx, c, node.Name, remediation.KindWaiting)
		for _, m := range ev {
			if strings.Contains(m, "held by the GPU operator's components dcgm (gpu-operator/nvidia-dcgm-") && strings.Contains(m, "remediation.pauseOperatorComponents") {
				return true, m, nil
			}
		}
		return false, fmt.Sprint(ev), err
	})
	if ev, _ := remediationEvents(ctx, c, node.Name, remediation.KindResetStarted); len(ev) != 0 {
		t.Errorf("a reset was tried while the components hold the GPU: %v", ev)
	}
	// The driver refuses the reset while DCGM's process holds the GPU.
	if out, err := exec.Command(gpuhealthBinary(t), "sim-driver", "inject", "--driver-root", root, "{gpu: 1, reset: true}").CombinedOutput(); err == nil || !strings.Contains(string(out), "reset refused") {
		t.Fatalf("a reset while another process holds the GPU: %v\n%s", err, out)
	}
	mark("the GPU waits for DCGM")
	first.stop(t)

	// 2. Allowed: pause, reset, restore.
	writeConfig(true)
	startProcess(t, "agent", filepath.Join(dir, "agent-2.log"), gpuhealthBinary(t), agentArgs...)
	eventually(t, "the agent to pause DCGM's label", func(ctx context.Context) (bool, string, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		v := n.Labels["nvidia.com/gpu.deploy.dcgm"]
		return v == remediation.ComponentPausedValue, "nvidia.com/gpu.deploy.dcgm=" + v, nil
	})
	// nv-hostengine ends with its pod, which the DaemonSet controller now deletes: its NVML
	// session ends before the pod is gone, and the agent resets only once the pod is gone.
	hostengine.stop(t)
	eventually(t, "the DaemonSet to take DCGM's pod away", func(ctx context.Context) (bool, string, error) {
		pods, err := dcgmPods(ctx)
		return len(pods) == 0, fmt.Sprint(pods), err
	})
	mark("DCGM paused and gone")
	waitPhase(t, c, node.Name, uuid, string(remediation.PhaseProbation))
	mark("the GPU reset")
	eventually(t, "DCGM's label given back and its pod back", func(ctx context.Context) (bool, string, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pods, err := dcgmPods(ctx)
		v := n.Labels["nvidia.com/gpu.deploy.dcgm"]
		return v == "true" && len(pods) == 1, fmt.Sprintf("label %q, pods %v", v, pods), err
	})
	mark("DCGM back")
	waitPhase(t, c, node.Name, uuid, "")
	mark("repaired")
	for _, kind := range []remediation.EventKind{remediation.KindPausedComponents, remediation.KindResetStarted, remediation.KindRestoredComponents, remediation.KindRepaired} {
		if ev, err := remediationEvents(ctx, c, node.Name, kind); err != nil || len(ev) != 1 {
			t.Errorf("%s Events: %v (%v), want one", kind, ev, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", remediation.ComponentRecordFileName)); !os.IsNotExist(err) {
		t.Errorf("the pause record is still there after the restore: %v", err)
	}
}
