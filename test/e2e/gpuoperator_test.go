//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	apiv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// The GPU operator's label for GPU clients that its driver manager and MIG manager pause, and
// the value its driver manager sets before it unloads the driver
// (/work/shared/notes/gpu-operator-facts.md).
const (
	operatorClientLabel = "nvidia.com/gpu.deploy.client"
	pausedForUpgrade    = "paused-for-driver-upgrade"
)

// TestAgentLeavesForTheGPUOperatorsDriverUpgrade installs the chart with gpu-operator-values.yaml
// on a real containerd node that looks operator-managed (the GPU labels, RuntimeClass nvidia) and
// plays the operator's driver manager: it pauses GPU clients through
// nvidia.com/gpu.deploy.client, as before a driver unload. The agent pod must leave (nothing of
// it may hold the driver), its report must stand unchanged while it is away (the fault, its
// DeviceTaintRule, the condition: no flap), and when the label is "true" again the agent comes
// back with the fault restored, never reporting the GPU Healthy in between.
func TestAgentLeavesForTheGPUOperatorsDriverUpgrade(t *testing.T) {
	skipWithoutContainers(t)
	t.Parallel()
	archive := imageArchive(t)
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1, Containers: true})
	ctx := t.Context()
	admin := c.Admin()
	node := c.KubeletNodes()[0]
	chartNode(t, c, node, archive, "gpuhealth/gpuhealth:"+chartAppVersion(t))
	// What the operator puts on a GPU node: the toolkit's RuntimeClass (here on plain runc: the
	// simulated GPUs need no NVIDIA runtime) and the labels GFD and the operator set.
	if _, err := admin.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "runc"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setClientLabel := func(value string) {
		t.Helper()
		mergePatchNodeLabels(t, c, node.Name, map[string]any{"nvidia.com/gpu.present": "true", operatorClientLabel: value})
	}
	setClientLabel("true")

	scenario := chartScenarioFile(t)
	release := helm.Options{
		Release: "gpuhealth", Namespace: "gpuhealth-system",
		// The operator's values, then what the local cluster needs (the simulated backend, the
		// imported image) without undoing them: local-values.yaml would clear the nodeSelector.
		Values:  []string{"deployments/helm/gpuhealth/gpu-operator-values.yaml"},
		SetFile: []string{"agent.sim.scenario=" + scenario},
		Set:     []string{"agent.backend=sim", "image.pullPolicy=Never", "config.sampleInterval=1s", "agent.readinessProbe.periodSeconds=2"},
	}
	if out, err := helm.Install(ctx, c.AdminKubeconfig(), release, "3m"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	const ns = "gpuhealth-system"
	selector := labels.Set{"app.kubernetes.io/instance": "gpuhealth", "app.kubernetes.io/component": "agent"}.String()
	agentPods := func(ctx context.Context) ([]corev1.Pod, error) {
		pods, err := admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, err
		}
		return pods.Items, nil
	}
	waitAgent := func(what string) *corev1.Pod {
		t.Helper()
		var ready *corev1.Pod
		eventually(t, what, func(ctx context.Context) (bool, string, error) {
			pods, err := agentPods(ctx)
			if err != nil {
				return false, "", err
			}
			var states []string
			ready = nil
			for i := range pods {
				p := &pods[i]
				states = append(states, fmt.Sprintf("%s %s ready=%v", p.Name, p.Status.Phase, podReady(p)))
				if podReady(p) && p.DeletionTimestamp == nil {
					ready = p
				}
			}
			return ready != nil && len(pods) == 1, strings.Join(states, "; "), nil
		})
		return ready
	}
	first := waitAgent("the agent pod Ready on the operator-managed node")
	if first.Spec.RuntimeClassName == nil || *first.Spec.RuntimeClassName != "nvidia" {
		t.Errorf("the agent runs under RuntimeClass %v, want the operator's nvidia", first.Spec.RuntimeClassName)
	}
	waitNodeFault(t, c, node.Name)
	waitTaintRule(t, c, node.Name)
	report := func(ctx context.Context) (string, error) {
		ann, err := nodeAnnotations(ctx, c, node.Name)
		if err != nil {
			return "", err
		}
		cond, err := nodeCondition(ctx, c, node.Name, nodecondition.Type)
		if err != nil {
			return "", err
		}
		rs, err := rules(ctx, c, node.Name)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("ids=%q condition=%s/%s rules=%v", ann[apiv1.UnhealthyIDsKey], cond.Status, cond.Reason, ruleNames(rs)), nil
	}
	// The sinks write independently: the snapshot is taken once every one of them carries the fault
	// (the condition can trail the annotation by a write).
	var before string
	eventually(t, "every sink to carry the fault before the upgrade", func(ctx context.Context) (bool, string, error) {
		cond, err := nodeCondition(ctx, c, node.Name, nodecondition.Type)
		if err != nil {
			return false, "", err
		}
		if before, err = report(ctx); err != nil {
			return false, "", err
		}
		return cond.Status == corev1.ConditionTrue, before, nil
	})

	// The driver manager pauses the GPU clients: the agent must be gone, and nothing of its report
	// may change while it is away.
	setClientLabel(pausedForUpgrade)
	eventually(t, "the agent pod to leave for the driver upgrade", func(ctx context.Context) (bool, string, error) {
		pods, err := agentPods(ctx)
		return len(pods) == 0, fmt.Sprintf("%d agent pods", len(pods)), err
	})
	time.Sleep(3 * time.Second) // as a driver unload would take: nothing may write meanwhile
	if during, err := report(ctx); err != nil || during != before {
		t.Errorf("while the agent was away the report changed:\n before %s\n during %s (%v)", before, during, err)
	}

	// The driver is back: the agent returns with its fault, never having said Healthy.
	setClientLabel("true")
	second := waitAgent("the agent pod back after the upgrade")
	if second.UID == first.UID {
		t.Fatal("the same agent pod is still there: it never left")
	}
	waitNodeFault(t, c, node.Name)
	if after, err := report(ctx); err != nil || after != before {
		t.Errorf("after the agent came back the report differs:\n before %s\n after  %s (%v)", before, after, err)
	}
	recovered, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", node.Name), fields.OneTermEqualSelector("reason", nodecondition.EventGPURecovered)).String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(recovered.Items) > 0 {
		t.Errorf("the GPU was reported recovered across the upgrade: %s", recovered.Items[0].Message)
	}
}

// mergePatchNodeLabels sets the node's labels (nil removes one) as the admin.
func mergePatchNodeLabels(t *testing.T, c *controlplane.Cluster, node string, set map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": set}})
	if err != nil {
		t.Fatal(err)
	}
	if err := patchNode(t.Context(), c.Admin(), node, string(body), ""); err != nil {
		t.Fatal(err)
	}
}
