//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// gpuSummary reads one GPU's entry of the node's gpu-health annotation.
func gpuSummary(ctx context.Context, c *controlplane.Cluster, node, uuid string) (gpuhealthv1.GPUSummary, error) {
	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		return gpuhealthv1.GPUSummary{}, err
	}
	all, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
	return all[uuid], err
}

// keptOut checks that every scheduling path keeps GPU index (uuid) of node out: its
// DeviceTaintRule is NoSchedule (DRA), Volcano's unhealthy list names it, and the extender's
// placement, reading the node as a device-plugin node of gpus GPUs, has it Unhealthy and refuses
// a pod that needs every GPU.
func keptOut(ctx context.Context, c *controlplane.Cluster, node, uuid string, index, gpus int) (bool, string, error) {
	effect, err := ruleEffect(ctx, c, uuid)
	if err != nil {
		return false, "", err
	}
	n, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	ids := n.Annotations[gpuhealthv1.UnhealthyIDsKey]
	dp := n.DeepCopy()
	dp.Status.Capacity = corev1.ResourceList{scheduling.ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}
	ng, _ := scheduling.ParseNode(dp)
	fits, why := scheduling.Filter(scheduling.Request{GPUs: int64(gpus)}, &ng, scheduling.Usage{})
	extenderOut := len(ng.GPUs) > index && ng.GPUs[index].Health == health.Unhealthy && !fits
	out := effect == "NoSchedule" && slices.Contains(strings.Split(ids, ","), fmt.Sprint(index)) && extenderOut
	return out, fmt.Sprintf("DeviceTaintRule %q, %s=%q, extender fits=%v (%s)", effect, gpuhealthv1.UnhealthyIDsKey, ids, fits, why), nil
}

// validationEvents returns the messages of the node's Events of a validation verdict (reason
// GPUValidation<kind>) about uuid.
func validationEvents(ctx context.Context, c *controlplane.Cluster, node, uuid string, kind remediation.EventKind) ([]string, error) {
	all, err := remediationEvents(ctx, c, node, kind)
	return slices.DeleteFunc(all, func(m string) bool { return !strings.Contains(m, uuid) }), err
}

// TestValidationBeforeReturn runs verify-before-return on a real kubelet node, through NVML on the
// simulated driver, with the simulated driver's own dcgmi testing one GPU at a time:
//
//  1. NVSentinel #695 reproduced and fixed: GPU 1 has a fault only a diagnostic finds, then an
//     XID 48. The reset clears the XID (a passive probation would give the GPU back), the
//     diagnostic fails it, twice, and it ends RemediationFailed with reason ValidationFailed and
//     GPURebootRequired; a DRA claim pinned to it is never allocated, the DRA, Volcano and
//     extender paths keep it out throughout, and a pod holding GPU 0 keeps running.
//  2. GPU 2, which the reset cures, passes and comes back; a claim then gets it.
//  3. GPU 3's host engine does not answer: GPUValidationError, the GPU stays out, no attempt.
//  4. `gpuhealth validate` asks for GPU 2 again and prints the verdict; bad input exits 2.
//  5. After a reboot (a checkpoint of another boot) GPU 1, which failed, and GPU 3, which was
//     being validated, are validated before they are offered: GPU 1 now passes.
func TestValidationBeforeReturn(t *testing.T) {
	t.Parallel()
	libs := simDriverLibraries(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	admin := c.Admin()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns, gpus = "validate", 4
	uuids, _ := realGPUNode(t, c, node.Name, gpus)
	if _, err := admin.ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	root := shortTempDir(t, "sd-val-")
	sd := startSimDriver(t, libs, root, "", node.Name, gpus, "550")
	bystander := podWithClaim(t, c, pinnedClaim(ns, "bystander", uuids[0], ""), node.Name)
	waitPodRunning(t, c, ns, bystander.Name)

	kubeconfig := agentKubeconfigOnNode(t, c, node.Name)
	remediationRBAC(t, c)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "config.yaml")
	dcgmi := filepath.Join(root, "usr", "bin", "dcgmi")
	cfg := agentConfig + remediationConfig(2, maxConcurrentInTests, node.PodResourcesSocket()) +
		fmt.Sprintf("  resetCommand: [%q, sim-driver, inject, --driver-root, %q, \"{gpu: {uuid}, reset: true}\"]\n", gpuhealthBinary(t), root) +
		fmt.Sprintf("  validation: {enabled: true, command: [%q, diag, -r, \"2\", -i, \"gpu:{dcgmID}\", -j], timeout: 30s, probation: 2s}\n", dcgmi)
	if err := os.WriteFile(configPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(dir, "state", "ckpt.json")
	agentArgs := []string{"agent", "--backend", "nvml", "--driver-root", root, "--node-name", node.Name, "--kubeconfig", kubeconfig,
		"--config", configPath, "--checkpoint", checkpoint, "--metrics-address", "", "-v", "2"}
	agent := startProcess(t, "agent", filepath.Join(dir, "agent-1.log"), gpuhealthBinary(t), agentArgs...)
	eventually(t, "the agent's first report", func(ctx context.Context) (bool, string, error) {
		if exited, log := agent.exited(); exited {
			return false, "", fmt.Errorf("the agent exited:\n%s", log)
		}
		s, err := gpuSummary(ctx, c, node.Name, uuids[1])
		return s.Health == "Healthy", s.Health, err
	})

	t.Run("a fault only a diagnostic finds keeps the GPU out until remediation gives up", func(t *testing.T) {
		sd.inject("{gpu: 1, latent: {xid: 48}}")
		sd.inject("{gpu: 1, xid: 48}")
		eventually(t, "GPU 1 tainted", func(ctx context.Context) (bool, string, error) {
			e, err := ruleEffect(ctx, c, uuids[1])
			return e == "NoSchedule", e, err
		})
		// A workload that wants exactly GPU 1: it must never get it.
		wants := podWithClaim(t, c, pinnedClaim(ns, "wants-gpu-1", uuids[1], ""), node.Name)
		eventuallyWithin(t, 3*time.Minute, "GPU 1 given up on after failed validations", func(ctx context.Context) (bool, string, error) {
			if dev, err := allocatedDevice(ctx, c, ns, wants.Name); err != nil || dev != "" {
				return false, "", fmt.Errorf("the claim pinned to GPU 1 was allocated %q (%w) during its repair", dev, err)
			}
			out, why, err := keptOut(ctx, c, node.Name, uuids[1], 1, gpus)
			if err != nil {
				return false, "", err
			}
			if !out {
				// The scheduling paths follow the repair annotation by a write or two.
				if r, _ := repairs(ctx, c, node.Name); r[uuids[1]].Phase == "" {
					return false, "", fmt.Errorf("GPU 1 offered during its repair: %s", why)
				}
			}
			r, err := repairs(ctx, c, node.Name)
			st := r[uuids[1]]
			return st.Phase == string(remediation.PhaseFailed), fmt.Sprintf("%+v; %s", st, why), err
		})
		// The simulated diagnostic answers at once: the Validating phase may come and go between
		// two writes of the remediation annotation, so its Events say it was there.
		if ev, err := validationEvents(ctx, c, node.Name, uuids[1], remediation.KindValidationStarted); err != nil || len(ev) == 0 {
			t.Errorf("GPUValidationStarted Events of GPU 1: %q %v", ev, err)
		}
		s, err := gpuSummary(ctx, c, node.Name, uuids[1])
		if err != nil || s.Health != "Unhealthy" || !slices.Contains(s.Reasons, gpuhealthv1.ReasonValidationFailed) ||
			s.Validation == nil || s.Validation.Result != "failed" {
			t.Errorf("GPU 1's summary: %+v (validation %+v) %v; want Unhealthy, ValidationFailed, validation failed", s, s.Validation, err)
		}
		cond, err := nodeCondition(ctx, c, node.Name, gpuhealthv1.ConditionGPURebootRequired)
		if err != nil || cond.Status != corev1.ConditionTrue {
			t.Errorf("GPURebootRequired: %+v %v", cond, err)
		}
		// Two failures (the Event recorder counts the second on the first, same message).
		if r, err := repairs(ctx, c, node.Name); err != nil || r[uuids[1]].Attempts != 2 {
			t.Errorf("GPU 1 given up on after %d attempts (%v), want 2", r[uuids[1]].Attempts, err)
		}
		failed, err := validationEvents(ctx, c, node.Name, uuids[1], remediation.KindValidationFailed)
		if err != nil || len(failed) == 0 || !strings.Contains(failed[0], "memory: Fail") || !strings.Contains(failed[0], "XID 48") {
			t.Errorf("GPUValidationFailed Events of GPU 1: %q %v, want them naming the failed memory test and XID 48", failed, err)
		}
		if p := waitPodRunning(t, c, ns, bystander.Name); p.Status.Phase != corev1.PodRunning {
			t.Errorf("the pod holding GPU 0: %s", p.Status.Phase)
		}
	})

	t.Run("a GPU the reset cures passes its validation and comes back", func(t *testing.T) {
		sd.inject("{gpu: 2, xid: 48}")
		eventually(t, "GPU 2's repair under way", func(ctx context.Context) (bool, string, error) {
			r, err := repairs(ctx, c, node.Name)
			return r[uuids[2]].Attempts == 1, fmt.Sprintf("%+v", r[uuids[2]]), err
		})
		st := waitPhase(t, c, node.Name, uuids[2], "")
		waitRuleGone(t, c, uuids[2])
		if st.Attempts != 1 {
			t.Errorf("GPU 2 repaired after %d attempts, want 1", st.Attempts)
		}
		eventually(t, "GPU 2's summary says it passed", func(ctx context.Context) (bool, string, error) {
			s, err := gpuSummary(ctx, c, node.Name, uuids[2])
			return s.Health == "Healthy" && s.Validation != nil && s.Validation.Result == "passed", fmt.Sprintf("%+v %+v", s, s.Validation), err
		})
		if ev, err := validationEvents(ctx, c, node.Name, uuids[2], remediation.KindValidationPassed); err != nil || len(ev) != 1 {
			t.Errorf("GPUValidationPassed Events of GPU 2: %q %v", ev, err)
		}
		after := podWithClaim(t, c, pinnedClaim(ns, "after-validation", uuids[2], ""), node.Name)
		waitPodRunning(t, c, ns, after.Name)
		if err := admin.CoreV1().Pods(ns).Delete(ctx, after.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a host engine that does not answer keeps the GPU out with no verdict", func(t *testing.T) {
		sd.inject("{gpu: 3, diag: unreachable}")
		sd.inject("{gpu: 3, xid: 48}")
		eventually(t, "a GPUValidationError Event for GPU 3", func(ctx context.Context) (bool, string, error) {
			ev, err := validationEvents(ctx, c, node.Name, uuids[3], remediation.KindValidationError)
			return len(ev) > 0, fmt.Sprint(ev), err
		})
		r, err := repairs(ctx, c, node.Name)
		if st := r[uuids[3]]; err != nil || st.Phase != string(remediation.PhaseValidating) || st.Attempts != 1 {
			t.Errorf("GPU 3 after an error: %+v %v; want Validating, the reset its only attempt", st, err)
		}
		eventually(t, "GPU 3 kept out", func(ctx context.Context) (bool, string, error) {
			return keptOut(ctx, c, node.Name, uuids[3], 3, gpus)
		})
	})

	t.Run("gpuhealth validate tests a GPU on request and prints the verdict", func(t *testing.T) {
		admin := c.AdminKubeconfig()
		out, err := exec.CommandContext(ctx, gpuhealthBinary(t), "validate", node.Name, "2", "--reason", "after RMA 4711",
			"--wait", "2m", "--kubeconfig", admin).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "passed:") || !strings.Contains(string(out), uuids[2]) {
			t.Fatalf("gpuhealth validate: %v\n%s", err, out)
		}
		if ann, err := nodeAnnotations(ctx, c, node.Name); err != nil || ann[gpuhealthv1.ValidationRequestsKey] != "" {
			t.Errorf("the request is still on the node: %q %v", ann[gpuhealthv1.ValidationRequestsKey], err)
		}
		started, err := remediationEvents(ctx, c, node.Name, remediation.KindStarted)
		if err != nil || !slices.ContainsFunc(started, func(m string) bool { return strings.Contains(m, "after RMA 4711") }) {
			t.Errorf("no Started Event names the request: %q %v", started, err)
		}
		for _, tc := range []struct{ name, node, gpu, want string }{
			{"unknown node", "no-such-node", "2", `node "no-such-node" not found`},
			{"unknown GPU", node.Name, "9", "9"},
		} {
			cmd := exec.CommandContext(ctx, gpuhealthBinary(t), "validate", tc.node, tc.gpu, "--kubeconfig", admin)
			out, err := cmd.CombinedOutput()
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			if cmd.ProcessState.ExitCode() != 2 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Errorf("%s: exit %d (%v), output %q; want exit 2 and one line with %q", tc.name, cmd.ProcessState.ExitCode(), err, out, tc.want)
			}
		}
	})

	t.Run("after a reboot the GPUs that were out are validated before they are offered", func(t *testing.T) {
		agent.stop(t)
		sd.inject("{gpu: 1, diag: pass}") // the card was reseated: its diagnostics pass now
		rebootCheckpoint(t, checkpoint)
		agent2 := startProcess(t, "agent", filepath.Join(dir, "agent-2.log"), gpuhealthBinary(t), agentArgs...)
		defer agent2.stop(t)
		eventuallyWithin(t, 2*time.Minute, "GPU 1 validated and back after the reboot", func(ctx context.Context) (bool, string, error) {
			s, err := gpuSummary(ctx, c, node.Name, uuids[1])
			if err != nil {
				return false, "", err
			}
			if s.Health == "Healthy" && (s.Validation == nil || s.Validation.Result != "passed") {
				return false, "", fmt.Errorf("GPU 1 offered after the reboot before a validation passed: %+v %+v", s, s.Validation)
			}
			return s.Health == "Healthy", fmt.Sprintf("%s %v %+v", s.Health, s.Reasons, s.Validation), nil
		})
		started, err := remediationEvents(ctx, c, node.Name, remediation.KindStarted)
		if err != nil || !slices.ContainsFunc(started, func(m string) bool { return strings.Contains(m, uuids[1]) && strings.Contains(m, "rebooted") }) {
			t.Errorf("no Started Event says GPU 1 is validated after the reboot: %q %v", started, err)
		}
		// GPU 3 was being validated when the node went down: still out, its engine still silent.
		eventually(t, "GPU 3 validated after the reboot, kept out", func(ctx context.Context) (bool, string, error) {
			r, err := repairs(ctx, c, node.Name)
			return r[uuids[3]].Phase == string(remediation.PhaseValidating), fmt.Sprintf("%+v", r[uuids[3]]), err
		})
		if out, why, err := keptOut(ctx, c, node.Name, uuids[3], 3, gpus); err != nil || !out {
			t.Errorf("GPU 3 after the reboot: %s %v", why, err)
		}
	})

	t.Run("the simulated dcgmi was asked about one GPU at a time, never GPU 0", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(root, "dcgmi-calls.log"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if strings.Contains(line, "diag") && (strings.Contains(line, "gpu:0") || !strings.Contains(line, "-i gpu:")) {
				t.Errorf("a diagnostic beyond the GPUs under validation: %s", line)
			}
		}
	})
}

// rebootCheckpoint makes the agent's checkpoint and remediation state those of an earlier boot:
// what the agent finds after the node rebooted.
func rebootCheckpoint(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := health.UnmarshalCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	cp.BootID = "an-earlier-boot"
	if err := health.WriteCheckpoint(path, cp); err != nil {
		t.Fatal(err)
	}
	statePath := filepath.Join(filepath.Dir(path), remediation.StateFileName)
	raw, err := os.ReadFile(statePath)
	if err != nil {
		t.Fatal(err)
	}
	var state map[string]json.RawMessage
	if err := json.Unmarshal(raw, &state); err != nil {
		t.Fatal(err)
	}
	state["bootID"] = json.RawMessage(`"an-earlier-boot"`)
	if raw, err = json.Marshal(state); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(statePath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}
