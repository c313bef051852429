//go:build e2e

package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Single faults under steady load: one GPU of one real agent fails, and the time until its
// DeviceTaintRule and its volcano.sh/gpu-unhealthy-ids are both seen through watches is its
// time to taint; then a bare client sends the same writes (as the bare wave does), timed the same
// way: the limit. One fault at a time, while the rest of the fleet renews its Leases.

// faultNodes are the real nodes the single faults go to, count at most: nodes without a GPU in
// the wave (node i holds one iff (i*8) % 10 != 2), so that a fault stays and the wave's targets
// are unchanged.
func faultNodes(fleet []*fleetNode, count int) []int {
	var out []int
	for i, n := range fleet {
		if len(out) == count {
			break
		}
		if !n.simulated && (i*gpusPerNode)%waveEvery == 2 {
			out = append(out, i)
		}
	}
	return out
}

// singleFaults fails GPU k%8 of the k-th fault node, one at a time, times each (and the bare
// client's same writes), and returns the faults (node name → the failing GPU) and what the agent
// wrote for the first fault on each GPU index (the simulated nodes' wave copies it).
func singleFaults(t *testing.T, admin kubernetes.Interface, agentCfg *rest.Config, fleet []*fleetNode, count int, fig *Figures) (faults map[string]int, templates map[int]*agentWrites) {
	t.Helper()
	ctx := t.Context()
	faults, templates = map[string]int{}, map[int]*agentWrites{}
	targets := faultNodes(fleet, count)
	if len(targets) == 0 {
		return faults, templates
	}
	cfg := rest.CopyConfig(agentCfg)
	cfg.QPS, cfg.Burst = agent.ClientQPS, agent.ClientBurst
	cfg.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
	bare, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	nodes, rules := observeNodesAndRules(admin)
	watchCtx, stopWatches := context.WithCancel(ctx)
	defer stopWatches()
	for _, o := range []*observed{nodes, rules} {
		if _, err := o.start(watchCtx); err != nil {
			t.Fatal(err)
		}
	}
	var agentLat, bareLat, agentRule, agentAnn, bareRule, bareAnn []time.Duration
	for k, i := range targets {
		n, g := fleet[i], k%gpusPerNode
		rule, ids := devicetaint.RuleName(n.name, n.uuids[g]), strconv.Itoa(g)
		injected := time.Now()
		n.backend.Signals <- health.Signal{Kind: health.SignalXID, Device: n.uuids[g], XID: waveXID, Time: injected}
		r, a := awaitTaint(t, nodes, rules, n.name, rule, gpuhealthv1.UnhealthyIDsKey, ids, true, injected)
		agentLat, agentRule, agentAnn = append(agentLat, max(r, a)), append(agentRule, r), append(agentAnn, a)
		faults[n.name] = g
		// Let the followers (condition, Event) write before anything is copied or timed again.
		waitCondition(t, admin, n.name)

		w, err := faultWrites(ctx, admin, n, g)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := templates[g]; !ok {
			templates[g] = w
		}
		br, ba := bareFault(t, bare, nodes, rules, w)
		bareLat, bareRule, bareAnn = append(bareLat, max(br, ba)), append(bareRule, br), append(bareAnn, ba)
	}
	stopWatches()
	fig.Faults = len(targets)
	fig.FaultTaint, fig.FaultRule, fig.FaultAnnotation = percentiles(agentLat), percentiles(agentRule), percentiles(agentAnn)
	fig.BareFaultTaint, fig.BareFaultRule, fig.BareFaultAnnotation = percentiles(bareLat), percentiles(bareRule), percentiles(bareAnn)
	return faults, templates
}

// awaitTaint waits until the rule and the annotation key=value on node are seen (present, or with
// !present gone) and returns when each was, since start.
func awaitTaint(t *testing.T, nodes, rules *observed, node, rule, key, value string, present bool, start time.Time) (ruleAt, annAt time.Duration) {
	t.Helper()
	gotRule, gotAnn := false, false
	deadline := time.After(convergeLimit)
	for !gotRule || !gotAnn {
		var obj k8sruntime.Object
		select {
		case obj = <-nodes.objects:
		case obj = <-rules.objects:
		case err := <-nodes.errs:
			t.Fatal(err)
		case err := <-rules.errs:
			t.Fatal(err)
		case <-deadline:
			t.Fatalf("fault on %s: after %v, rule %s seen %v, %s=%s seen %v", node, convergeLimit, rule, gotRule, key, value, gotAnn)
		}
		now := time.Since(start)
		switch obj := obj.(type) {
		case *corev1.Node:
			if !gotAnn && obj.Name == node && obj.Annotations[key] == value {
				gotAnn, annAt = true, now
			}
		case *resourcev1.DeviceTaintRule:
			if !gotRule && obj.Name == rule {
				gotRule, ruleAt = true, now
			}
		}
	}
	return ruleAt, annAt
}

// waitCondition waits until node's GPUUnhealthy condition is True.
func waitCondition(t *testing.T, admin kubernetes.Interface, node string) {
	t.Helper()
	deadline := time.Now().Add(convergeLimit)
	for {
		n, err := admin.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if conditionTrue(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: no GPUUnhealthy condition after %v", node, convergeLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// bareFault sends what the agent wrote for one fault (w) with the bare client, under the bare
// wave's keys and names, times it as the agent's fault was timed, and then removes it (untimed).
func bareFault(t *testing.T, bare kubernetes.Interface, nodes, rules *observed, w *agentWrites) (ruleAt, annAt time.Duration) {
	t.Helper()
	ctx := t.Context()
	copied := map[string]any{}
	for key, v := range w.annotations {
		copied[bareKeyPrefix+baseName(key)] = v
	}
	sw := &simWrite{node: w.node, client: bare}
	var err error
	if sw.annotation, err = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": copied}}); err != nil {
		t.Fatal(err)
	}
	cond := corev1.NodeCondition{Type: bareConditionType, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}
	if len(w.conditions) > 0 {
		cond.Reason, cond.Message = w.conditions[0].Reason, w.conditions[0].Message
	}
	if sw.status, err = json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}}); err != nil {
		t.Fatal(err)
	}
	sw.event = waveEvent(w.node, "gpuhealth-bare", "BareFault", cond.Message)
	var names []string
	for _, r := range w.rules {
		name := bareRulePrefix + r.Name
		names = append(names, name)
		sw.rules = append(sw.rules, &resourcev1.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{devicetaint.NodeLabel: bareRulePrefix + w.node}},
			Spec:       r.Spec,
		})
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- sw.send(ctx, "gpuhealth-bare") }()
	ruleAt, annAt = awaitTaint(t, nodes, rules, w.node, names[0], bareKeyPrefix+baseName(gpuhealthv1.UnhealthyIDsKey), w.annotations[gpuhealthv1.UnhealthyIDsKey], true, start)
	if err := <-done; err != nil {
		t.Fatalf("bare fault: %v", err)
	}
	// Take it away again, so that the wave and its checks find only the agents' objects.
	remove := map[string]any{}
	for key := range copied {
		remove[key] = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": remove}})
	if _, err := bare.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if err := bare.ResourceV1().DeviceTaintRules().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return ruleAt, annAt
}

// Percentiles are p50, p90 and p99 in seconds.
type Percentiles struct{ P50, P90, P99 float64 }

func percentiles(d []time.Duration) Percentiles {
	s := slices.Clone(d)
	slices.Sort(s)
	return Percentiles{percentile(s, 0.50).Seconds(), percentile(s, 0.90).Seconds(), percentile(s, 0.99).Seconds()}
}

func (p Percentiles) String() string {
	return fmt.Sprintf("p50 %s, p90 %s, p99 %s", ms(p.P50), ms(p.P90), ms(p.P99))
}

func ms(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.1f ms", s*1000)
	}
	return fmt.Sprintf("%.2f s", s)
}
