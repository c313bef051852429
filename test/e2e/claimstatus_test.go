//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/claimstatus"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// ourCondition returns the gpuhealth condition of device in the claim's status, if any.
func ourCondition(claim *resourcev1.ResourceClaim, device string) (metav1.Condition, bool) {
	for _, ds := range claim.Status.Devices {
		if ds.Device != device {
			continue
		}
		for _, c := range ds.Conditions {
			if c.Type == claimstatus.ConditionType {
				return c, true
			}
		}
	}
	return metav1.Condition{}, false
}

// claimStatusConfig points the agent's claimstatus reporter at a kubelet's pod-resources socket
// (startAgent's topConfig, inside the agent section).
func claimStatusConfig(socket string) string {
	return fmt.Sprintf("  claimStatus:\n    podResourcesSocket: %q\n", socket)
}

// TestClaimStatusReportsSickGPUs runs the agent with a token bound to its node, as a DaemonSet
// pod has, so that the API server's per-driver check (resourceclaims/driver, associated-node)
// lets it write status.devices: a claim holding a GPU that turns Unhealthy gets a condition for
// that device, a claim on a healthy GPU gets none, and the condition goes away on recovery. The
// node is a real kubelet whose DRA plugin prepared the claims: the agent finds them through the
// kubelet's pod-resources API.
func TestClaimStatusReportsSickGPUs(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	const ns = "claims"
	node := c.KubeletNode(controlplane.KubeletNodeName(0)).Name
	uuids, _ := realGPUNode(t, c, node, 8)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	podWithClaim(t, c, pinnedClaim(ns, "on-sick", uuids[2], ""), node)
	podWithClaim(t, c, pinnedClaim(ns, "on-healthy", uuids[4], ""), node)
	waitAllocated(t, c, ns, "on-sick", controlplane.GPUDeviceName(2))
	waitAllocated(t, c, ns, "on-healthy", controlplane.GPUDeviceName(4))
	waitPodRunning(t, c, ns, "on-sick")
	waitPodRunning(t, c, ns, "on-healthy")

	startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: agentKubeconfigOnNode(t, c, node), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: claimStatusConfig(c.KubeletNode(node).PodResourcesSocket()),
		scenario:  "events:\n  - {at: 2s, gpu: 2, xid: 48}\n  - {at: 10s, gpu: 2, reset: true}\n"})

	eventually(t, "the claim on the sick GPU carries the condition", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-sick", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		cond, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return ok && cond.Status == metav1.ConditionFalse && cond.Reason == claimstatus.ReasonUnhealthy &&
			cond.Message != "" && !cond.LastTransitionTime.IsZero(), fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
	healthy, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-healthy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(healthy.Status.Devices) != 0 {
		t.Errorf("the claim on a healthy GPU got device status: %+v", healthy.Status.Devices)
	}
	eventually(t, "the condition goes away after the GPU reset", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-sick", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		_, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return !ok, fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
}

// unmarkedByClaimStatus matches a count above zero of GPUs claimstatus could not mark.
var unmarkedByClaimStatus = regexp.MustCompile(`(?m)^gpuhealth_unmatched_devices_total\{reporter="claimstatus"\} [1-9]`)

// TestClaimStatusSaysWhenItCannotFindClaims: an agent whose pod-resources socket is not there
// (a node without the kubelet's socket mounted) runs and turns Ready; its claimstatus reporter
// says so in one ClaimStatusUnavailable Event naming the socket and counts the GPU it cannot mark
// (gpuhealth_unmatched_devices_total{reporter="claimstatus"}), while the other reporters report
// the fault.
func TestClaimStatusSaysWhenItCannotFindClaims(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true})
	ctx := t.Context()
	const node = "claims-nowhere"
	gpuNode(t, c, node, 4)
	socket := filepath.Join(t.TempDir(), "pod-resources", "kubelet.sock")
	a := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: agentKubeconfigOnNode(t, c, node), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: claimStatusConfig(socket), scenario: "events:\n  - {at: 1s, gpu: 1, xid: 79}\n"})

	eventually(t, "the fault reported on the Node and counted as unmarked by claimstatus", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		body, err := httpGet(a.metrics + "/metrics")
		if err != nil {
			return false, "", err
		}
		unmarked := unmarkedByClaimStatus.MatchString(body)
		return ann[gpuhealthv1.UnhealthyIDsKey] == "1" && unmarked, fmt.Sprintf("ids=%q unmarked=%v", ann[gpuhealthv1.UnhealthyIDsKey], unmarked), nil
	})
	msg := waitEvent(t, c, metav1.NamespaceDefault, node, claimstatus.EventUnavailable, socket)
	if !strings.Contains(msg, "podResourcesSocket") {
		t.Errorf("the Event does not say what to set: %q", msg)
	}
	events, err := c.Admin().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + claimstatus.EventUnavailable})
	if err != nil {
		t.Fatal(err)
	}
	if len(events.Items) != 1 || events.Items[0].Count > 1 {
		t.Errorf("want one ClaimStatusUnavailable Event, said once: %d Events, %+v", len(events.Items), events.Items)
	}
}

// TestClaimStatusByPodWatchUnderTheChart: for kubelets that do not name claims, the chart with
// config.agent.claimStatus.podWatch grants the pod watch, and an agent with a node-bound token,
// under exactly that RBAC and policy, finds the claim of a pod on its node (which has no kubelet)
// through the watch and marks it when its GPU fails.
func TestClaimStatusByPodWatchUnderTheChart(t *testing.T) {
	t.Parallel()
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace, Set: []string{"config.agent.claimStatus.podWatch=true"}})
	c := controlplane.StartT(t, controlplane.Options{Controllers: append(controlplane.DefaultControllers(), "validatingadmissionpolicy-status-controller")})
	ctx := t.Context()
	const ns, node = "claims-watched", "claims-watch-node"
	uuids := gpuNode(t, c, node, 4)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{ns, helmNamespace} {
		if _, err := c.CreateNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	podWithClaim(t, c, pinnedClaim(ns, "watched", uuids[2], ""), node)
	waitAllocated(t, c, ns, "watched", controlplane.GPUDeviceName(2))
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, helmPolicy)
	cfg := boundAgentConfig(t, c, node)
	kubeconfig := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: "  claimStatus:\n    podWatch: true\n", scenario: "events:\n  - {at: 1s, gpu: 2, xid: 48}\n"})
	eventually(t, "the claim on the sick GPU carries the condition", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "watched", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		cond, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return ok && cond.Reason == claimstatus.ReasonUnhealthy, fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
	if msgs, err := evictionEvents(ctx, c, metav1.NamespaceDefault, node, claimstatus.EventUnavailable); err != nil || len(msgs) > 0 {
		t.Errorf("with a pod watch nothing is unavailable, yet: %q (%v)", msgs, err)
	}
}
