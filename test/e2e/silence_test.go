//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestSilentAgentsAreMarked runs the breaker controller, as its least-privilege ServiceAccount,
// against Nodes whose agents' heartbeats say every kind of silence, on the real API server: a
// stale heartbeat, one far in the future, one that goes stale while the controller watches, one
// whose annotation is removed after it was seen. Each node gets GPUUnhealthy Unknown with reason
// AgentSilent, a GPUAgentSilent Event and the taint; a node whose agent writes again loses the
// taint and gets GPUAgentBack; a node with an older agent's report and no heartbeat ever, and a
// node with no agent, are left alone.
func TestSilentAgentsAreMarked(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	admin := c.Admin()
	if _, err := c.CreateNamespace(ctx, agentNamespace); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	report := `{"GPU-1":{"index":0,"health":"Healthy"}}`
	nodes := map[string]map[string]string{
		"silent-stale":    {gpuhealthv1.HealthKey: report, gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now.Add(-time.Hour))},
		"silent-future":   {gpuhealthv1.HealthKey: report, gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now.Add(24 * time.Hour))},
		"silent-later":    {gpuhealthv1.HealthKey: report, gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now)},
		"silent-removed":  {gpuhealthv1.HealthKey: report, gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(now)},
		"silent-oldagent": {gpuhealthv1.HealthKey: report},
		"silent-noagent":  nil,
	}
	for name, ann := range nodes {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "example.com/keep", Effect: corev1.TaintEffectNoSchedule}}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	metrics := startBreakerControllerWith(t, c, []string{"--stale-after", "20s", "--agent-silent-taint"})

	marked := func(ctx context.Context, name string) (bool, string, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		var cond *corev1.NodeCondition
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == gpuhealthv1.ConditionGPUUnhealthy {
				cond = &n.Status.Conditions[i]
			}
		}
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == gpuhealthv1.AgentSilentTaintKey && t.Effect == corev1.TaintEffectNoSchedule
		})
		kept := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "example.com/keep" })
		silent := cond != nil && cond.Status == corev1.ConditionUnknown && cond.Reason == gpuhealthv1.ReasonAgentSilent
		return silent && tainted && kept, fmt.Sprintf("condition %+v tainted=%v kept=%v", cond, tainted, kept), nil
	}
	for _, name := range []string{"silent-stale", "silent-future"} {
		eventually(t, name+" marked silent", func(ctx context.Context) (bool, string, error) { return marked(ctx, name) })
	}
	// Heartbeats go stale with no event to announce it: the controller looks again in time.
	eventuallyWithin(t, 20*time.Second+pollTimeout, "silent-later marked once its heartbeat is stale",
		func(ctx context.Context) (bool, string, error) { return marked(ctx, "silent-later") })
	// Removing the heartbeat does not make a dead agent "never stale".
	mergePatchNode(t, admin, "silent-removed", map[string]any{gpuhealthv1.HeartbeatKey: nil})
	eventually(t, "silent-removed marked once its heartbeat is removed", func(ctx context.Context) (bool, string, error) { return marked(ctx, "silent-removed") })

	eventually(t, "the controller exports the silent nodes", func(context.Context) (bool, string, error) {
		body, err := httpGet(metrics + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(body, "gpuhealth_agent_silent_nodes 4") && strings.Contains(body, "gpuhealth_agent_silences_total 4"),
			"no gpuhealth_agent_silent_nodes 4 / gpuhealth_agent_silences_total 4 yet", nil
	})

	// The agent of silent-stale writes again: the taint goes, the Event says so (the condition
	// is the agent's to rewrite). Its heartbeat goes stale again 20s later: check at once.
	mergePatchNode(t, admin, "silent-stale", map[string]any{gpuhealthv1.HeartbeatKey: gpuhealthv1.FormatHeartbeat(time.Now())})
	eventually(t, "silent-stale untainted once its agent writes again", func(ctx context.Context) (bool, string, error) {
		n, err := admin.CoreV1().Nodes().Get(ctx, "silent-stale", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		back, err := nodeEvents(ctx, c, "silent-stale", gpuhealthv1.EventAgentBack)
		if err != nil {
			return false, "", err
		}
		tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1.AgentSilentTaintKey })
		return !tainted && len(back) == 1, fmt.Sprintf("taints %v, %d GPUAgentBack Events", n.Spec.Taints, len(back)), nil
	})
	for _, name := range []string{"silent-future", "silent-later", "silent-removed"} {
		events, err := nodeEvents(ctx, c, name, gpuhealthv1.EventAgentSilent)
		if err != nil || len(events) != 1 || events[0].Type != corev1.EventTypeWarning || !strings.Contains(events[0].Message, "is silent") {
			t.Errorf("%s: GPUAgentSilent Events %+v %v; want one Warning", name, events, err)
		}
	}
	// Those without a heartbeat ever are left alone.
	for _, name := range []string{"silent-oldagent", "silent-noagent"} {
		n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Status.Conditions) != 0 || slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == gpuhealthv1.AgentSilentTaintKey }) {
			t.Errorf("%s was marked: conditions %+v, taints %+v", name, n.Status.Conditions, n.Spec.Taints)
		}
	}
}
