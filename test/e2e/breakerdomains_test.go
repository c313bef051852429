//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestBreakerDomainHoldsABadRack: four nodes of 4 GPUs in two racks (a budget per rack of a
// quarter, 2 GPUs; the cluster's half, 8). Rack a loses 4 GPUs, rack b 1, at once: rack a is
// held at its budget (2 NoSchedule, 2 None), rack b is admitted (and, below its budget, is no
// finding), and the cluster's budget has room. The full rack is one finding (one Event on the breaker's ConfigMap, one metric series),
// its held nodes' GPUCircuitBreakerOpen condition names it, and `gpuhealth breaker status` shows
// it. `gpuhealth breaker ack` frees every domain's budget: the held GPUs get their effect.
func TestBreakerDomainHoldsABadRack(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const gpus, rackLabel = 4, "example.com/rack"
	racks := map[string]string{"dom-a0": "a", "dom-a1": "a", "dom-b0": "b", "dom-b1": "b"}
	nodes := []string{"dom-a0", "dom-a1", "dom-b0", "dom-b1"}
	for _, n := range nodes {
		labelledGPUNode(t, c, n, gpus, map[string]string{rackLabel: racks[n]})
	}
	kubeconfigs := map[string]string{}
	for _, n := range nodes {
		kubeconfigs[n] = agentKubeconfigOnNode(t, c, n)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-breaker"}, Rules: agent.BreakerRoleRules()}
	if _, err := c.Admin().RbacV1().Roles(agentNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-breaker"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNamespace, Name: "gpuhealth-agent"}},
	}
	if _, err := c.Admin().RbacV1().RoleBindings(agentNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	controllerMetrics := startBreakerControllerWith(t, c, []string{"--domain", rackLabel + "=0.25"})
	// Rack a: GPUs 0 and 1 of both nodes fall off the bus; rack b: GPU 0 of dom-b0.
	for _, n := range nodes {
		scenario := "events:\n  - {at: 12s, gpu: 0, xid: 79}\n"
		if n == "dom-b1" {
			scenario = ""
		}
		if racks[n] == "a" {
			scenario += "  - {at: 12s, gpu: 1, xid: 79}\n"
		}
		startAgent(t, agentSetup{node: n, gpus: gpus, kubeconfig: kubeconfigs[n], checkpoint: filepath.Join(t.TempDir(), n+".ckpt"), scenario: scenario,
			agentConfig: fmt.Sprintf("  circuitBreaker: {enabled: true, maxFraction: 0.5, window: 10m, namespace: %s, domains: [{label: %s, maxFraction: 0.25}]}\n",
				agentNamespace, rackLabel)})
	}
	eventually(t, "the breaker controller counts the cluster's and each rack's GPUs (from the agents' reports) before the faults", func(ctx context.Context) (bool, string, error) {
		cm, err := c.Admin().CoreV1().ConfigMaps(agentNamespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		n, _ := breaker.ParseState(cm)
		d := breaker.ParseDomainGPUs(cm)
		return n == 16 && d[rackLabel]["a"] == 8 && d[rackLabel]["b"] == 8, fmt.Sprintf("count %d, domains %v", n, d), nil
	})

	// effects are the DeviceTaintRules' effects by rack.
	effects := func(ctx context.Context) (map[string]map[resourcev1.DeviceTaintEffect]int, error) {
		list, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.ManagedByLabel + "=" + devicetaint.ManagedBy})
		if err != nil {
			return nil, err
		}
		out := map[string]map[resourcev1.DeviceTaintEffect]int{"a": {}, "b": {}}
		for _, r := range list.Items {
			for _, n := range nodes {
				for i := range gpus {
					if r.Labels[devicetaint.UUIDLabel] == sim.GPUUUID(n, i) {
						out[racks[n]][r.Spec.Taint.Effect]++
					}
				}
			}
		}
		return out, nil
	}
	eventually(t, "rack a is held at its budget of 2 and rack b admitted", func(ctx context.Context) (bool, string, error) {
		e, err := effects(ctx)
		if err != nil {
			return false, "", err
		}
		if e["a"][resourcev1.DeviceTaintEffectNoSchedule] > 2 {
			return false, "", fmt.Errorf("rack a got %d NoSchedule past its budget of 2", e["a"][resourcev1.DeviceTaintEffectNoSchedule])
		}
		return e["a"][resourcev1.DeviceTaintEffectNoSchedule] == 2 && e["a"][resourcev1.DeviceTaintEffectNone] == 2 &&
			e["b"][resourcev1.DeviceTaintEffectNoSchedule] == 1, fmt.Sprint(e), nil
	})
	eventually(t, "the held nodes name their rack, and the rest say nothing is held", func(ctx context.Context) (bool, string, error) {
		var named, closed int
		var msgs []string
		for _, n := range nodes {
			cond, err := nodeCondition(ctx, c, n, nodecondition.BreakerType)
			if err != nil {
				return false, err.Error(), nil
			}
			msgs = append(msgs, n+": "+cond.Message)
			switch {
			case cond.Status == corev1.ConditionTrue && strings.Contains(cond.Message, rackLabel+"=a"):
				named++
			case cond.Status == corev1.ConditionFalse:
				closed++
			}
		}
		return named >= 1 && named+closed == len(nodes), strings.Join(msgs, "; "), nil
	})
	eventually(t, "the full rack is one finding: one Event on the breaker's ConfigMap and one metric series", func(ctx context.Context) (bool, string, error) {
		evs, err := c.Admin().CoreV1().Events(agentNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + breaker.EventDomainFull})
		if err != nil {
			return false, err.Error(), nil
		}
		body, err := httpGet(controllerMetrics + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		var on []string
		for _, e := range evs.Items {
			on = append(on, e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name+" x"+fmt.Sprint(e.Count)+": "+e.Message)
		}
		series := strings.Count(body, "gpuhealth_breaker_domain_full{")
		ok := len(evs.Items) == 1 && evs.Items[0].InvolvedObject.Kind == "ConfigMap" && evs.Items[0].InvolvedObject.Name == breaker.ConfigMapName &&
			strings.Contains(evs.Items[0].Message, rackLabel+"=a") &&
			strings.Contains(body, `gpuhealth_breaker_domain_full{label="`+rackLabel+`",value="a"} 1`) && series == 1
		return ok, fmt.Sprintf("events %v, %d series", on, series), nil
	})
	out, stderr, code := gpuhealthCLI(t, "breaker", "status", "--kubeconfig", c.AdminKubeconfig(), "-n", agentNamespace)
	if code != 0 || !strings.Contains(out, "cluster GPUs: 16") || !strings.Contains(out, "DOMAIN") ||
		!strings.Contains(out, fmt.Sprintf("%s   a       8      2        2      yes", rackLabel)) {
		t.Errorf("breaker status: exit %d, want rack a full:\n%s%s", code, out, stderr)
	}

	if out, stderr, code := gpuhealthCLI(t, "breaker", "ack", "--kubeconfig", c.AdminKubeconfig(), "-n", agentNamespace); code != 0 {
		t.Fatalf("breaker ack: exit %d, %q %q", code, out, stderr)
	}
	eventually(t, "after the acknowledgement rack a's held GPUs get their effect", func(ctx context.Context) (bool, string, error) {
		e, err := effects(ctx)
		if err != nil {
			return false, "", err
		}
		return e["a"][resourcev1.DeviceTaintEffectNoSchedule] == 4 && e["b"][resourcev1.DeviceTaintEffectNoSchedule] == 1, fmt.Sprint(e), nil
	})
}
