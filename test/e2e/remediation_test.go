//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// remediationRBAC gives the agents exactly agent.RemediationRoleRules in their namespace, for
// the largest maxConcurrent the tests use.
func remediationRBAC(t *testing.T, c *controlplane.Cluster) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-remediation"}, Rules: agent.RemediationRoleRules(maxConcurrentInTests)}
	if _, err := c.Admin().RbacV1().Roles(agentNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-remediation"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNamespace, Name: "gpuhealth-agent"}},
	}
	if _, err := c.Admin().RbacV1().RoleBindings(agentNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// remediationConfig is the HealthConfig section the e2e agents repair with: 5 s probation.
// maxConcurrentInTests bounds the maxConcurrent of remediationConfig: the agents' Role may delete
// only that many slots by name.
const maxConcurrentInTests = 4

func remediationConfig(maxAttempts, maxConcurrent int, podResourcesSocket string) string {
	return fmt.Sprintf("remediation:\n  enabled: true\n  maxAttempts: %d\n  maxConcurrent: %d\n  probation: 5s\n  window: 10m\n  resetTimeout: 20s\n  namespace: %s\n  podResourcesSocket: %q\n",
		maxAttempts, maxConcurrent, agentNamespace, podResourcesSocket)
}

// repairs reads the node's remediation annotation.
func repairs(ctx context.Context, c *controlplane.Cluster, node string) (map[string]gpuhealthv1.GPURemediation, error) {
	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		return nil, err
	}
	return gpuhealthv1.ParseRemediation(ann[gpuhealthv1.RemediationKey])
}

// waitPhase waits until the GPU's remediation is in phase ("" = no repair under way) and returns
// its state.
func waitPhase(t *testing.T, c *controlplane.Cluster, node, uuid, phase string) gpuhealthv1.GPURemediation {
	t.Helper()
	var got gpuhealthv1.GPURemediation
	eventually(t, fmt.Sprintf("GPU %s in remediation phase %q", uuid, phase), func(ctx context.Context) (bool, string, error) {
		r, err := repairs(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		got = r[uuid]
		return got.Phase == phase, fmt.Sprintf("%+v", got), nil
	})
	return got
}

// ruleEffect returns the effect of gpuhealth's DeviceTaintRule for the GPU, "" when there is none.
func ruleEffect(ctx context.Context, c *controlplane.Cluster, uuid string) (string, error) {
	list, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.UUIDLabel + "=" + dra.LabelValue(uuid)})
	if err != nil || len(list.Items) == 0 {
		return "", err
	}
	return string(list.Items[0].Spec.Taint.Effect), nil
}

func waitRuleGone(t *testing.T, c *controlplane.Cluster, uuid string) time.Time {
	t.Helper()
	eventually(t, "no DeviceTaintRule for "+uuid, func(ctx context.Context) (bool, string, error) {
		e, err := ruleEffect(ctx, c, uuid)
		return e == "", "effect " + e, err
	})
	return time.Now()
}

// remediationEvents returns the messages of the node's Events with the given reason.
func remediationEvents(ctx context.Context, c *controlplane.Cluster, node string, kind remediation.EventKind) ([]string, error) {
	list, err := c.Admin().CoreV1().Events("default").List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", node),
			fields.OneTermEqualSelector("reason", remediation.Event{Kind: kind}.Reason())).String(),
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Message)
	}
	return out, nil
}

// TestRemediationWaitsForThePodsThenRepairs: two GPUs of a real kubelet node need a reset, one
// held by a running pod through a DRA ResourceClaim, the other through the device plugin
// (nvidia.com/gpu, seen in the kubelet's pod-resources API). Nothing is reset while the pods run;
// each GPU is reset once its pod ends, goes through probation, loses its taint, and a new pod
// lands on it.
func TestRemediationWaitsForThePodsThenRepairs(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{KubeletNodes: 1})
	ctx := t.Context()
	node := c.KubeletNode(controlplane.KubeletNodeName(0))
	const ns = "remed"
	uuids, _ := realGPUNode(t, c, node.Name, 2)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	// GPU 0 is held through DRA.
	draHolder := podWithClaim(t, c, pinnedClaim(ns, "dra-holder", uuids[0], ""), node.Name)
	waitPodRunning(t, c, ns, draHolder.Name)
	// GPU 1 is held through the device plugin: its own simulation leaves only GPU 1 healthy, so
	// the kubelet can only allocate that one.
	var others strings.Builder
	for i := range 8 {
		if i != 1 {
			fmt.Fprintf(&others, "  - {at: 0s, gpu: %d, xid: 79}\n", i)
		}
	}
	startDevicePlugin(t, node, "events:\n"+others.String(), filepath.Join(t.TempDir(), "dp.json"))
	waitGPUs(t, c, node.Name, 8, 1)
	if _, err := c.Admin().CoreV1().Pods(ns).Create(ctx, gpuPod(ns, "dp-holder", node.Name, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPodRunning(t, c, ns, "dp-holder")
	if held := podResourcesGPUs(t, node, ns, "dp-holder"); !slices.Equal(held, []string{uuids[1]}) {
		t.Fatalf("device-plugin pod holds %v, want [%s]", held, uuids[1])
	}

	kubeconfig := agentKubeconfigOnNode(t, c, node.Name)
	remediationRBAC(t, c)
	faultAt := time.Now().Add(2 * time.Second)
	startAgent(t, agentSetup{node: node.Name, gpus: 2, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: remediationConfig(3, 2, node.PodResourcesSocket()),
		scenario: "events:\n  - {at: 2s, gpu: 0, xid: 48}\n  - {at: 2s, gpu: 1, xid: 48}\n"})

	t.Run("nothing is reset while the pods hold the GPUs", func(t *testing.T) {
		for i, want := range []string{ns + "/dra-holder (claim dra-holder)", ns + "/dp-holder"} {
			eventually(t, fmt.Sprintf("GPU %d waits for %s", i, want), func(ctx context.Context) (bool, string, error) {
				r, err := repairs(ctx, c, node.Name)
				got := r[uuids[i]]
				return got.Phase == string(remediation.PhaseWaitingForPods) && strings.Contains(got.Message, want), fmt.Sprintf("%+v", got), err
			})
			if e, err := ruleEffect(ctx, c, uuids[i]); err != nil || e != "NoSchedule" {
				t.Errorf("GPU %d tainted %q (%v), want NoSchedule while it waits", i, e, err)
			}
		}
		// Ten polls of the agent's: still waiting, never reset.
		for range 10 {
			time.Sleep(500 * time.Millisecond)
			r, err := repairs(ctx, c, node.Name)
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range uuids {
				if r[u].Phase != string(remediation.PhaseWaitingForPods) || r[u].Attempts != 0 {
					t.Fatalf("GPU %s while held: %+v", u, r[u])
				}
			}
		}
		if ev, err := remediationEvents(ctx, c, node.Name, remediation.KindResetStarted); err != nil || len(ev) > 0 {
			t.Fatalf("resets while held: %v %v", ev, err)
		}
	})

	repairAfter := func(t *testing.T, i int, pod string) {
		// The pod stops holding the GPU once the kubelet reports it terminated (its phase),
		// shortly before the object is gone.
		deleted := time.Now()
		if err := c.Admin().CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](1)}); err != nil {
			t.Fatal(err)
		}
		waitPhase(t, c, node.Name, uuids[i], string(remediation.PhaseProbation))
		if e, err := ruleEffect(ctx, c, uuids[i]); err != nil || e != "NoSchedule" {
			t.Errorf("GPU %d on probation tainted %q (%v), want NoSchedule", i, e, err)
		}
		st := waitPhase(t, c, node.Name, uuids[i], "")
		back := waitRuleGone(t, c, uuids[i])
		if st.Attempts != 1 {
			t.Errorf("GPU %d repaired after %d attempts, want 1", i, st.Attempts)
		}
		t.Logf("GPU %d: pod deleted → back in service (taint removed) in %s; fault → back in service %s, of which %s waiting for the pod (probation 5s)",
			i, back.Sub(deleted).Round(100*time.Millisecond), back.Sub(faultAt).Round(100*time.Millisecond), deleted.Sub(faultAt).Round(100*time.Millisecond))
	}
	t.Run("the DRA pod ends: GPU 0 is reset, verified and given back", func(t *testing.T) {
		repairAfter(t, 0, draHolder.Name)
		r, err := repairs(ctx, c, node.Name)
		if err != nil || r[uuids[1]].Phase != string(remediation.PhaseWaitingForPods) {
			t.Fatalf("GPU 1, still held: %+v %v", r[uuids[1]], err)
		}
		again := podWithClaim(t, c, pinnedClaim(ns, "after-repair", uuids[0], ""), node.Name)
		waitPodRunning(t, c, ns, again.Name)
	})
	t.Run("the device-plugin pod ends: GPU 1 is reset, verified and given back", func(t *testing.T) {
		repairAfter(t, 1, "dp-holder")
	})
	t.Run("Events tell every step", func(t *testing.T) {
		for _, k := range []remediation.EventKind{remediation.KindStarted, remediation.KindWaiting, remediation.KindResetStarted, remediation.KindResetObserved, remediation.KindRepaired} {
			ev, err := remediationEvents(ctx, c, node.Name, k)
			if err != nil || len(ev) < 2 {
				t.Errorf("%s events: %v %v, want one per GPU", k, ev, err)
			}
		}
	})
}

// TestRemediationBudgetRepairsOneAtATime: three idle GPUs need a reset at once and the cluster
// allows one repair at a time: never more than one is reset or on probation, and all three come
// back, one after another.
func TestRemediationBudgetRepairsOneAtATime(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const node = "remed-budget"
	uuids := gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfigOnNode(t, c, node)
	remediationRBAC(t, c)
	faultAt := time.Now().Add(time.Second)
	startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: remediationConfig(3, 1, "-"),
		scenario: "events:\n  - {at: 1s, gpu: 0, xid: 48}\n  - {at: 1s, gpu: 1, xid: 48}\n  - {at: 1s, gpu: 2, xid: 48}\n"})

	var order []string // GPUs in the order they went on probation
	seen := map[string]bool{}
	eventuallyWithin(t, 3*pollTimeout, "all three GPUs repaired, one at a time", func(ctx context.Context) (bool, string, error) {
		r, err := repairs(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		busy := 0
		for _, u := range uuids[:3] {
			switch r[u].Phase {
			case string(remediation.PhaseResetting), string(remediation.PhaseProbation):
				busy++
				if !seen[u] {
					seen[u] = true
					order = append(order, u)
				}
			}
		}
		if busy > 1 {
			return false, "", fmt.Errorf("%d GPUs in remediation at once with a budget of one: %+v", busy, r)
		}
		done := 0
		for _, u := range uuids[:3] {
			if r[u].Phase == "" && r[u].Attempts == 1 {
				done++
			}
		}
		return done == 3, fmt.Sprintf("%d repaired: %+v", done, r), nil
	})
	back := time.Now()
	for _, u := range uuids[:3] {
		waitRuleGone(t, c, u)
	}
	if len(order) != 3 {
		t.Errorf("saw %d GPUs under repair, want each of the three: %v", len(order), order)
	}
	if r, _ := repairs(ctx, c, node); r[uuids[3]].Phase != "" || r[uuids[3]].Attempts != 0 {
		t.Errorf("the healthy GPU 3 was touched: %+v", r[uuids[3]])
	}
	leases, err := c.Admin().CoordinationV1().Leases(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: remediation.SlotLabel})
	if err != nil || len(leases.Items) != 0 {
		t.Errorf("slots left after the repairs: %d (%v)", len(leases.Items), err)
	}
	t.Logf("fault → all three GPUs back in service: %s (three resets with 5s probation each, in series)", back.Sub(faultAt).Round(100*time.Millisecond))
}

// TestRemediationGivesUpWhenTheFaultReturns: a GPU whose fault comes back after every reset is
// reset maxAttempts times, then stays out with reason RemediationFailed, and the Node says it
// needs a reboot (GPURebootRequired), for node-level repair to take over.
func TestRemediationGivesUpWhenTheFaultReturns(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const node = "remed-fail"
	uuids := gpuNode(t, c, node, 2)
	kubeconfig := agentKubeconfigOnNode(t, c, node)
	remediationRBAC(t, c)
	a := startAgent(t, agentSetup{node: node, gpus: 2, kubeconfig: kubeconfig,
		checkpoint: filepath.Join(t.TempDir(), "ckpt.json"), topConfig: remediationConfig(2, 1, "-"),
		scenario: "events:\n  - {at: 1s, gpu: 0, xid: 48}\n  - {afterReset: 2s, gpu: 0, xid: 48}\n"})

	st := waitPhase(t, c, node, uuids[0], string(remediation.PhaseFailed))
	if st.Attempts != 2 || !strings.Contains(st.Message, "came back") {
		t.Errorf("gave up with %+v, want 2 attempts and why", st)
	}
	eventually(t, "GPURebootRequired=True (RemediationFailed)", func(ctx context.Context) (bool, string, error) {
		cond, err := nodeCondition(ctx, c, node, corev1.NodeConditionType(gpuhealthv1.ConditionGPURebootRequired))
		return cond.Status == corev1.ConditionTrue && cond.Reason == gpuhealthv1.ReasonRemediationFailed && strings.Contains(cond.Message, uuids[0]),
			fmt.Sprintf("%+v", cond), err
	})
	eventually(t, "the GPU's summary says RemediationFailed", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		h, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
		return h[uuids[0]].Health == "Unhealthy" && slices.Contains(h[uuids[0]].Reasons, gpuhealthv1.ReasonRemediationFailed), fmt.Sprintf("%+v", h[uuids[0]]), err
	})
	// It stays out: no further reset, still tainted.
	time.Sleep(3 * time.Second)
	if e, err := ruleEffect(ctx, c, uuids[0]); err != nil || e != "NoSchedule" {
		t.Errorf("given-up GPU tainted %q (%v), want NoSchedule", e, err)
	}
	if ev, err := remediationEvents(ctx, c, node, remediation.KindResetStarted); err != nil || len(ev) != 2 {
		t.Errorf("reset events %v (%v), want exactly 2", ev, err)
	}
	if ev, err := remediationEvents(ctx, c, node, remediation.KindGaveUp); err != nil || len(ev) != 1 {
		t.Errorf("GaveUp events %v (%v), want 1", ev, err)
	}
	if r, _ := repairs(ctx, c, node); r[uuids[1]].Phase != "" {
		t.Errorf("healthy GPU 1: %+v", r[uuids[1]])
	}
	body, err := httpGet(a.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`gpuhealth_remediation_events_total{event="ResetStarted",node="` + node + `"} 2`,
		`gpuhealth_remediation_events_total{event="AttemptFailed",node="` + node + `"} 2`,
		`gpuhealth_remediation_events_total{event="GaveUp",node="` + node + `"} 1`,
		`gpuhealth_remediation_gpus{node="` + node + `",phase="RemediationFailed"} 1`,
		`reason="RemediationFailed"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestRemediationResumesAfterARestart kills the agent (SIGKILL) while a reset GPU is on
// probation: the new agent resumes the probation from the state file instead of starting over,
// then gives the GPU back and frees the slot.
func TestRemediationResumesAfterARestart(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const node = "remed-restart"
	uuids := gpuNode(t, c, node, 2)
	kubeconfig := agentKubeconfigOnNode(t, c, node)
	remediationRBAC(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	setup := agentSetup{node: node, gpus: 2, kubeconfig: kubeconfig, checkpoint: checkpoint,
		topConfig: remediationConfig(3, 1, "-"), scenario: "events:\n  - {at: 1s, gpu: 0, xid: 48}\n"}
	first := startAgent(t, setup)
	before := waitPhase(t, c, node, uuids[0], string(remediation.PhaseProbation))
	first.kill()
	killed := time.Now()

	// The same boot, no new fault: what the new agent knows of the repair comes from the state
	// file next to the checkpoint.
	setup.scenario = ""
	startAgent(t, setup)
	st := waitPhase(t, c, node, uuids[0], "")
	if st.Attempts != 1 {
		t.Errorf("repaired after %d attempts, want the one before the restart", st.Attempts)
	}
	waitRuleGone(t, c, uuids[0])
	if ev, err := remediationEvents(ctx, c, node, remediation.KindResetStarted); err != nil || len(ev) != 1 {
		t.Errorf("reset events %v (%v), want the one before the restart", ev, err)
	}
	leases, err := c.Admin().CoordinationV1().Leases(agentNamespace).List(ctx, metav1.ListOptions{LabelSelector: remediation.SlotLabel})
	if err != nil || len(leases.Items) != 0 {
		t.Errorf("slots left: %d (%v)", len(leases.Items), err)
	}
	t.Logf("killed %s into the probation; the new agent finished it %s after the kill",
		killed.Sub(before.Since).Round(100*time.Millisecond), time.Since(killed).Round(100*time.Millisecond))
}

// TestHelmChartRemediation applies the chart with remediation on to a real API server: the
// admission policy still confines the agent, but lets it write its remediation annotation and
// the GPURebootRequired condition, and a real agent with a node-bound token repairs a GPU under
// exactly the chart's RBAC (its slot Role) and policy.
func TestHelmChartRemediation(t *testing.T) {
	t.Parallel()
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace, Set: []string{"config.remediation.enabled=true"}})
	c := controlplane.StartT(t, controlplane.Options{
		DisableScheduler: true,
		Controllers:      []string{"serviceaccount", "validatingadmissionpolicy-status-controller"},
	})
	ctx := t.Context()
	const nodeA = "helm-remed-a"
	uuids := gpuNode(t, c, nodeA, 2)
	if _, err := c.CreateNamespace(ctx, helmNamespace); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, helmPolicy)
	cfgA := boundAgentConfig(t, c, nodeA)
	asA := clientFor(t, cfgA)
	// A new value each time: a patch that changes nothing is not a change the policy denies.
	waitDenied(t, "the policy to be enforced", func(ctx context.Context) error {
		return patchAnnotations(ctx, asA, nodeA, map[string]any{"example.com/x": fmt.Sprint(time.Now().UnixNano())})
	})
	for _, tc := range []struct {
		name, denied string
		request      func(ctx context.Context) error
	}{
		{"remediation annotation", "", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.RemediationKey: "{}"})
		}},
		{"GPURebootRequired condition", "", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, conditionPatch(gpuhealthv1.ConditionGPURebootRequired, "False"), "status")
		}},
		{"Ready condition", "GPURebootRequired", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, conditionPatch("Ready", "False"), "status")
		}},
	} {
		err := tc.request(ctx)
		switch {
		case tc.denied == "" && err != nil:
			t.Errorf("%s: want success, got %v", tc.name, err)
		case tc.denied != "" && (err == nil || !deniedByPolicy(err) || !strings.Contains(err.Error(), tc.denied)):
			t.Errorf("%s: want denied by the policy mentioning %q, got %v", tc.name, tc.denied, err)
		}
	}

	kubeconfig := filepath.Join(t.TempDir(), "agent-a.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfgA); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentSetup{node: nodeA, gpus: 2, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: strings.Replace(remediationConfig(3, 1, "-"), "namespace: "+agentNamespace, "namespace: "+helmNamespace, 1),
		scenario:  "events:\n  - {at: 1s, gpu: 1, xid: 48}\n"})
	waitPhase(t, c, nodeA, uuids[1], string(remediation.PhaseProbation))
	if st := waitPhase(t, c, nodeA, uuids[1], ""); st.Attempts != 1 {
		t.Errorf("repaired with %d attempts, want 1", st.Attempts)
	}
	eventually(t, "GPURebootRequired=False written by the agent", func(ctx context.Context) (bool, string, error) {
		cond, err := nodeCondition(ctx, c, nodeA, corev1.NodeConditionType(gpuhealthv1.ConditionGPURebootRequired))
		return cond.Status == corev1.ConditionFalse && cond.Reason == gpuhealthv1.ReasonNoRebootRequired, fmt.Sprintf("%+v", cond), err
	})
}

// TestRemediationEvictsAfterTheGracePeriod: with evictAfter (and agent.noExecute), a pod that
// still holds a GPU waiting for a reset when the grace period ends is evicted through the GPU's
// DeviceTaintRule turning NoExecute (kube-controller-manager's device-taint eviction); then the
// GPU is reset and given back.
func TestRemediationEvictsAfterTheGracePeriod(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const node, ns = "remed-evict", "remed-evict"
	uuids := gpuNode(t, c, node, 2)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c.StartKubeletT(t, node)
	holder := podWithClaim(t, c, pinnedClaim(ns, "holder", uuids[0], ""), node)
	waitAllocated(t, c, ns, holder.Name, "gpu-0")
	kubeconfig := agentKubeconfigOnNode(t, c, node)
	remediationRBAC(t, c)
	startAgent(t, agentSetup{node: node, gpus: 2, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		noExecute: true, topConfig: remediationConfig(3, 1, "-") + "  evictAfter: 3s\n",
		scenario: "events:\n  - {at: 1s, gpu: 0, xid: 48}\n"})

	waiting := waitPhase(t, c, node, uuids[0], string(remediation.PhaseWaitingForPods))
	if e, err := ruleEffect(ctx, c, uuids[0]); err != nil || e != "NoSchedule" {
		t.Errorf("before the grace period: effect %q (%v), want NoSchedule", e, err)
	}
	eventually(t, "the holder evicted", func(ctx context.Context) (bool, string, error) {
		p, err := c.Admin().CoreV1().Pods(ns).Get(ctx, holder.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "gone", nil
		}
		if err != nil {
			return false, "", err
		}
		return p.UID != holder.UID, fmt.Sprintf("deletionTimestamp %v", p.DeletionTimestamp), nil
	})
	evicted := time.Now()
	if ev, err := remediationEvents(ctx, c, node, remediation.KindEvicting); err != nil || len(ev) != 1 {
		t.Errorf("Evicting events %v (%v), want 1", ev, err)
	}
	if st := waitPhase(t, c, node, uuids[0], ""); st.Attempts != 1 {
		t.Errorf("repaired after %d attempts, want 1", st.Attempts)
	}
	waitRuleGone(t, c, uuids[0])
	t.Logf("waiting since %s; holder evicted %s later", waiting.Since.Format(time.RFC3339), evicted.Sub(waiting.Since).Round(100*time.Millisecond))
}
