//go:build e2e

package e2e

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// rules returns this node's DeviceTaintRules by name.
func rules(ctx context.Context, c *controlplane.Cluster, node string) (map[string]resourcev1.DeviceTaintRule, error) {
	list, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.NodeLabel + "=" + node})
	if err != nil {
		return nil, err
	}
	out := map[string]resourcev1.DeviceTaintRule{}
	for _, r := range list.Items {
		// By the name the rule stands for: one created under a generated name (its own was held
		// by another node's rule) says which in its key annotation.
		out[cmp.Or(r.Annotations[devicetaint.KeyAnnotation], r.Name)] = r
	}
	return out, nil
}

func ruleNames(m map[string]resourcev1.DeviceTaintRule) []string {
	var names []string
	for n, r := range m {
		names = append(names, fmt.Sprintf("%s(%s=%s:%s)", n, r.Spec.Taint.Key, r.Spec.Taint.Value, r.Spec.Taint.Effect))
	}
	slices.Sort(names)
	return names
}

// TestAgentReportsFaultsAndRecovery drives a real agent process with a scenario and checks every
// sink: the Volcano annotation, the DeviceTaintRules with the right effects, the Node condition
// and the Events, through the fault and through recovery.
func TestAgentReportsFaultsAndRecovery(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-faults"
	uuids := gpuNode(t, c, node, 8)
	startAgent(t, agentSetup{
		node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: `events:
  - {at: 1s, gpu: 3, xid: 48}
  - {at: 1s, gpu: 5, temperatureC: 91}
  - {at: 1s, gpu: 6, xid: 79}
  - {at: 5s, gpu: 3, reset: true}
  - {at: 5s, gpu: 5, temperatureC: 60}
`,
	})

	eventually(t, "fault reported on every sink", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		cond, err := nodeCondition(ctx, c, node, nodecondition.Type)
		if err != nil {
			return false, "", err
		}
		want := map[string]string{
			devicetaint.RuleName(node, uuids[3]): "gpuhealth.dev/xid=48:NoSchedule",
			devicetaint.RuleName(node, uuids[5]): "gpuhealth.dev/thermal=TemperatureAtSlowdown:None",
			devicetaint.RuleName(node, uuids[6]): "gpuhealth.dev/xid=79:NoSchedule", // NoExecute is opt-in
		}
		ok := ann[gpuhealthv1.UnhealthyIDsKey] == "3,6" && cond.Status == corev1.ConditionTrue && len(rs) == len(want)
		for name, taint := range want {
			r := rs[name]
			ok = ok && fmt.Sprintf("%s=%s:%s", r.Spec.Taint.Key, r.Spec.Taint.Value, r.Spec.Taint.Effect) == taint &&
				r.Spec.Taint.TimeAdded != nil && *r.Spec.DeviceSelector.Pool == node
		}
		return ok, fmt.Sprintf("ids=%q condition=%s rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], cond.Status, ruleNames(rs)), nil
	})

	eventually(t, "recovery removes the reset GPU and the cooled one", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		_, only79 := rs[devicetaint.RuleName(node, uuids[6])]
		return ann[gpuhealthv1.UnhealthyIDsKey] == "6" && len(rs) == 1 && only79,
			fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), nil
	})

	eventually(t, "events for the transitions", func(ctx context.Context) (bool, string, error) {
		evs, err := c.Admin().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
		if err != nil {
			return false, "", err
		}
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			reasons[e.Reason] = true
		}
		return reasons[nodecondition.EventGPUUnhealthy] && reasons[nodecondition.EventGPUDegraded] && reasons[nodecondition.EventGPURecovered],
			fmt.Sprintf("%v", reasons), nil
	})
}

// TestAgentRestartKeepsStateWithoutWrites kills the agent mid-fault with SIGKILL and starts a new
// one with no fault in its scenario: the checkpoint must carry the fault over, and the new agent
// must find the API server already right and write nothing.
func TestAgentRestartKeepsStateWithoutWrites(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	const node = "agent-restart"
	uuids := gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	first := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: checkpoint,
		scenario: "events:\n  - {at: 0s, gpu: 2, xid: 79}\n"})
	eventually(t, "fault reported", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		return err == nil && ann[gpuhealthv1.UnhealthyIDsKey] == "2" && len(rs) == 1, fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), err
	})
	first.kill()

	rule, err := c.Admin().ResourceV1().DeviceTaintRules().Get(ctx, devicetaint.RuleName(node, uuids[2]), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeBefore, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeWatch, err := c.Admin().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node, ResourceVersion: nodeBefore.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeWatch.Stop()

	second := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: "events: []\n"})
	if w := second.writes(); w["annotation"]+w["devicetaint"]+w["condition"] != 0 {
		t.Errorf("restarted agent wrote %v; want no write (its checkpoint matches the API server)", w)
	}
	after, err := c.Admin().ResourceV1().DeviceTaintRules().Get(ctx, rule.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the rule is gone after the restart: %v", err)
	}
	if after.ResourceVersion != rule.ResourceVersion {
		t.Errorf("the rule was rewritten (resourceVersion %s -> %s)", rule.ResourceVersion, after.ResourceVersion)
	}
	nodeWatch.Stop()
	for ev := range nodeWatch.ResultChan() {
		if n, ok := ev.Object.(*corev1.Node); ok && ev.Type == watch.Modified {
			t.Errorf("the node was modified during the restart: ids=%q", n.Annotations[gpuhealthv1.UnhealthyIDsKey])
		}
	}
	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if ann[gpuhealthv1.UnhealthyIDsKey] != "2" {
		t.Errorf("after the restart %s = %q, want 2", gpuhealthv1.UnhealthyIDsKey, ann[gpuhealthv1.UnhealthyIDsKey])
	}
}

// TestAgentReconcilesStaleStateAtStart leaves objects from an earlier run that no longer hold (an
// annotation naming GPUs that are healthy now, a rule for a GPU that recovered) next to foreign
// annotations: the agent removes what is stale and touches nothing else.
func TestAgentReconcilesStaleStateAtStart(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	const node = "agent-stale"
	uuids := gpuNode(t, c, node, 4)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"0,1",%q:"{}","example.com/keep":"yes"}}}`, gpuhealthv1.UnhealthyIDsKey, gpuhealthv1.HealthKey)
	if _, err := c.Admin().CoreV1().Nodes().Patch(ctx, node, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	stale := controlplane.GPUDeviceTaintRule(devicetaint.RuleName(node, uuids[1]), node, "gpu-1", resourcev1.DeviceTaint{Key: "gpuhealth.dev/xid", Value: "48", Effect: resourcev1.DeviceTaintEffectNoSchedule})
	stale.Labels = map[string]string{devicetaint.NodeLabel: node, devicetaint.UUIDLabel: uuids[1]}
	if _, err := c.Admin().ResourceV1().DeviceTaintRules().Create(ctx, stale, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	foreign := controlplane.GPUDeviceTaintRule("maintenance-window", node, "gpu-2", resourcev1.DeviceTaint{Key: "example.com/maintenance", Effect: resourcev1.DeviceTaintEffectNoSchedule})
	if _, err := c.Admin().ResourceV1().DeviceTaintRules().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), scenario: "events: []\n"})

	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		t.Fatal(err)
	}
	if ids, ok := ann[gpuhealthv1.UnhealthyIDsKey]; ok {
		t.Errorf("stale %s=%q survived the start-up reconcile", gpuhealthv1.UnhealthyIDsKey, ids)
	}
	if !strings.Contains(ann[gpuhealthv1.HealthKey], uuids[0]) {
		t.Errorf("%s = %q, want every GPU listed", gpuhealthv1.HealthKey, ann[gpuhealthv1.HealthKey])
	}
	if ann["example.com/keep"] != "yes" {
		t.Errorf("a foreign annotation was changed: %v", ann)
	}
	if _, err := c.Admin().ResourceV1().DeviceTaintRules().Get(ctx, stale.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("stale rule %s: err = %v, want NotFound", stale.Name, err)
	}
	if _, err := c.Admin().ResourceV1().DeviceTaintRules().Get(ctx, foreign.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("a foreign rule was touched: %v", err)
	}
}

// TestAgentXIDStormWritesOncePerSink sends 10,000 identical XIDs: exactly one write per sink for
// the one state change, seen both in the agent's own counters and through watches.
func TestAgentXIDStormWritesOncePerSink(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	const node = "agent-storm"
	gpuNode(t, c, node, 8)
	nodeBefore, err := c.Admin().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rulesBefore, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 3s, gpu: 1, xid: 79, repeat: 10000}\n  - {at: 4s, gpu: 1, xid: 79, repeat: 10000}\n"})
	base := a.writes()
	if base["devicetaint"] != 0 {
		t.Fatalf("devicetaint wrote %d times at start with every GPU healthy", base["devicetaint"])
	}
	ruleWatch, err := c.Admin().ResourceV1().DeviceTaintRules().Watch(ctx, metav1.ListOptions{
		LabelSelector: devicetaint.NodeLabel + "=" + node, ResourceVersion: rulesBefore.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ruleWatch.Stop()
	eventually(t, "storm reported", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		return err == nil && ann[gpuhealthv1.UnhealthyIDsKey] == "1", fmt.Sprintf("ids=%q", ann[gpuhealthv1.UnhealthyIDsKey]), err
	})
	// Let the second burst and several sampling rounds pass, then count.
	eventually(t, "both bursts processed", func(ctx context.Context) (bool, string, error) {
		resp, err := httpGet(a.metrics + "/metrics")
		if err != nil {
			return false, "", nil
		}
		return strings.Contains(resp, `gpuhealth_xid_total{`) && strings.Contains(resp, `xid="79"} 20000`), "waiting for 20000 XIDs", nil
	})
	got := a.writes()
	for _, sink := range []string{"annotation", "devicetaint", "condition"} {
		if d := got[sink] - base[sink]; d != 1 {
			t.Errorf("%s: %d writes for one state change, want 1", sink, d)
		}
	}
	var ruleEvents []string
	for _, ev := range drain(ruleWatch) {
		ruleEvents = append(ruleEvents, string(ev.Type))
	}
	if len(ruleEvents) != 1 || ruleEvents[0] != string(watch.Added) {
		t.Errorf("rule watch saw %v, want exactly one ADDED", ruleEvents)
	}
	nodeWatch, err := c.Admin().CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node, ResourceVersion: nodeBefore.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeWatch.Stop()
	idChanges, last := 0, ""
	for ev := range nodeWatch.ResultChan() {
		n, ok := ev.Object.(*corev1.Node)
		if !ok {
			continue
		}
		if v := n.Annotations[gpuhealthv1.UnhealthyIDsKey]; v != last {
			idChanges++
			last = v
		}
		if last == "1" && n.ResourceVersion == mustNodeRV(t, c, node) {
			break
		}
	}
	if idChanges != 1 {
		t.Errorf("%s changed %d times, want 1", gpuhealthv1.UnhealthyIDsKey, idChanges)
	}
}

// drain returns the events a watch delivers until it has been quiet for a second, then stops it.
func drain(w watch.Interface) []watch.Event {
	var out []watch.Event
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return out
			}
			out = append(out, ev)
		case <-time.After(time.Second):
			w.Stop()
			return out
		}
	}
}

func mustNodeRV(t *testing.T, c *controlplane.Cluster, node string) string {
	t.Helper()
	n, err := c.Admin().CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.ResourceVersion
}

// TestAgentConvergesAfterAPIServerRestart takes kube-apiserver away while a fault happens: the
// agent's writes fail and back off, and once the API server is back the agent converges to the
// true state without being restarted itself.
func TestAgentConvergesAfterAPIServerRestart(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-apiserver-restart"
	uuids := gpuNode(t, c, node, 4)
	a := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 4s, gpu: 1, xid: 79}\n"})
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	// The fault happens while the API server is away; the agent sees it and cannot write.
	time.Sleep(6 * time.Second)
	if err := c.StartAPIServer(t.Context()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "agent converges after the API server returns", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", nil // the API server may still be warming up
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", nil
		}
		_, ok := rs[devicetaint.RuleName(node, uuids[1])]
		return ann[gpuhealthv1.UnhealthyIDsKey] == "1" && ok && len(rs) == 1,
			fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), nil
	})
	if got := a.writes(); got["annotation"] < 1 || got["devicetaint"] != 1 {
		t.Errorf("writes = %v; want the fault written once the API server was back", got)
	}
}
