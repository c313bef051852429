//go:build e2e

package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
)

// What TestFleetBreakerDomain checks once the wave settled, each from the API server.

// checkDomainRules lists the DeviceTaintRules: exactly one per failing GPU; the bad rack's budget
// NoSchedule and the rest None; every other rack's NoSchedule.
func checkDomainRules(t *testing.T, admin kubernetes.Interface, rackOfRule map[string]string, bad string, budget, badGPUs int) {
	t.Helper()
	list, err := admin.ResourceV1().DeviceTaintRules().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var held, admittedBad, admitted int
	for _, r := range list.Items {
		rack, ok := rackOfRule[r.Name]
		switch {
		case !ok:
			t.Errorf("unexpected DeviceTaintRule %s (%s)", r.Name, r.Spec.Taint.Effect)
		case rack == bad && r.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNone:
			held++
		case rack == bad && r.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNoSchedule:
			admittedBad++
		case rack != bad && r.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNoSchedule:
			admitted++
		default:
			t.Errorf("DeviceTaintRule %s of rack %s: effect %s", r.Name, rack, r.Spec.Taint.Effect)
		}
	}
	if len(list.Items) != len(rackOfRule) || admittedBad != budget || held != badGPUs-budget || admitted != len(rackOfRule)-badGPUs {
		t.Errorf("%d rules: rack %s %d NoSchedule and %d None, the other racks %d NoSchedule; want %d: %d, %d and %d",
			len(list.Items), bad, admittedBad, held, admitted, len(rackOfRule), budget, badGPUs-budget, len(rackOfRule)-badGPUs)
	}
}

// checkDomainSlots counts the bad rack's live domain slots: its budget.
func checkDomainSlots(t *testing.T, admin kubernetes.Interface, bad string, budget int) {
	t.Helper()
	key := breaker.DomainKey(rackLabel, bad)
	list, err := admin.CoordinationV1().Leases(agentNamespace).List(t.Context(), metav1.ListOptions{LabelSelector: breaker.DomainSlotLabel + "=" + key})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != budget {
		t.Errorf("rack %s holds %d domain slots, want its budget of %d", bad, len(list.Items), budget)
	}
}

// checkHeldNodes waits until every node with a held GPU (a None rule) says so in its
// GPUCircuitBreakerOpen condition, naming the rack, and checks that no other node does.
func checkHeldNodes(t *testing.T, admin kubernetes.Interface, size int, bad string) {
	t.Helper()
	ctx := t.Context()
	rules, err := admin.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	heldNodes := map[string]bool{}
	for _, r := range rules.Items {
		if r.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNone {
			heldNodes[r.Labels[devicetaint.NodeLabel]] = true
		}
	}
	deadline := time.Now().Add(domainLimit)
	for {
		nodes, err := admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var wrong []string
		for i := range nodes.Items {
			n := &nodes.Items[i]
			open, msg := breakerOpen(n)
			named := open && strings.Contains(msg, rackLabel+"="+bad)
			if named != heldNodes[n.Name] || open != heldNodes[n.Name] {
				wrong = append(wrong, fmt.Sprintf("%s (held %t): open %t: %s", n.Name, heldNodes[n.Name], open, msg))
			}
		}
		if len(nodes.Items) != size {
			wrong = append(wrong, fmt.Sprintf("%d nodes, want %d", len(nodes.Items), size))
		}
		if len(wrong) == 0 {
			t.Logf("the %d nodes with held GPUs name rack %s in their %s condition; no other node has it", len(heldNodes), bad, nodecondition.BreakerType)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %d nodes' %s condition is not what their rules say: %v", domainLimit, len(wrong), nodecondition.BreakerType, wrong)
		}
		time.Sleep(time.Second)
	}
}

// breakerOpen returns whether node's GPUCircuitBreakerOpen condition is True, and its message.
func breakerOpen(node *corev1.Node) (bool, string) {
	for _, c := range node.Status.Conditions {
		if c.Type == nodecondition.BreakerType {
			return c.Status == corev1.ConditionTrue, c.Message
		}
	}
	return false, ""
}

// checkDomainFinding waits for the controller's CircuitBreakerDomainFull Event, then for one more
// of its rounds, and checks there is exactly one, on the breaker's ConfigMap, naming the bad rack,
// and one gpuhealth_breaker_domain_full series, the bad rack's.
func checkDomainFinding(t *testing.T, admin kubernetes.Interface, metrics, bad string, injected time.Time) {
	t.Helper()
	ctx := t.Context()
	deadline := time.Now().Add(domainLimit)
	var events []corev1.Event
	for len(events) == 0 {
		list, err := admin.CoreV1().Events(agentNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + breaker.EventDomainFull})
		if err != nil {
			t.Fatal(err)
		}
		if events = list.Items; len(events) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s Event after %v", breaker.EventDomainFull, domainLimit)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("%s Event %.1fs after the wave: %s", breaker.EventDomainFull, time.Since(injected).Seconds(), events[0].Message)
	time.Sleep(11 * time.Second) // one more round of the controller's domain watcher (10 s)
	list, err := admin.CoreV1().Events(agentNamespace).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + breaker.EventDomainFull})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Count > 1 || list.Items[0].InvolvedObject.Kind != "ConfigMap" ||
		list.Items[0].InvolvedObject.Name != breaker.ConfigMapName || !strings.Contains(list.Items[0].Message, rackLabel+"="+bad) {
		t.Errorf("%s Events: %+v; want one, on ConfigMap %s, naming %s=%s", breaker.EventDomainFull, list.Items, breaker.ConfigMapName, rackLabel, bad)
	}
	body, err := httpGet(ctx, metrics+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	series := strings.Count(body, "gpuhealth_breaker_domain_full{")
	if want := fmt.Sprintf(`gpuhealth_breaker_domain_full{label=%q,value=%q} 1`, rackLabel, bad); series != 1 || !strings.Contains(body, want) {
		t.Errorf("%d gpuhealth_breaker_domain_full series; want one, %s", series, want)
	}
}
