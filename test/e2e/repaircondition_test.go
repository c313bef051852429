//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// acceleratedHardwareReady is the condition Karpenter's AWS provider and EKS node auto repair
// replace (or reboot) a node for when it has been False for 10 minutes.
const acceleratedHardwareReady = corev1.NodeConditionType("AcceleratedHardwareReady")

// repairConditionConfig is the agent section's line that turns the repair contract on.
const repairConditionConfig = "  repairCondition: {type: AcceleratedHardwareReady}\n"

// TestRepairConditionAsksForARebootUnderTheChart applies the chart with
// config.agent.repairCondition.type AcceleratedHardwareReady to a real API server: its admission
// policy lets a node-bound agent write that condition (and no longer GPURebootRequired, nor
// Ready), and a real agent under exactly the chart's RBAC and policy reports a healthy node as
// AcceleratedHardwareReady True, NoRepairRequired, then, when GPU 1 falls off the bus (XID 79),
// False with reason RebootRequired naming the GPU.
func TestRepairConditionAsksForARebootUnderTheChart(t *testing.T) {
	t.Parallel()
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace,
		Set: []string{"config.agent.repairCondition.type=AcceleratedHardwareReady", "config.remediation.enabled=true"}})
	c := controlplane.StartT(t, controlplane.Options{
		DisableScheduler: true,
		Controllers:      []string{"serviceaccount", "validatingadmissionpolicy-status-controller"},
	})
	ctx := t.Context()
	const node = "repair-chart"
	uuids := gpuNode(t, c, node, 2)
	t.Cleanup(func() { dumpRepairState(t, c, node) })
	if _, err := c.CreateNamespace(ctx, helmNamespace); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, helmPolicy)
	cfg := boundAgentConfig(t, c, node)
	as := clientFor(t, cfg)
	waitDenied(t, "the policy to be enforced", func(ctx context.Context) error {
		return patchAnnotations(ctx, as, node, map[string]any{"example.com/x": fmt.Sprint(time.Now().UnixNano())})
	})
	if err := patchNode(ctx, as, node, conditionPatch(string(acceleratedHardwareReady), "True"), "status"); err != nil {
		t.Errorf("the agent writing its repair condition: %v", err)
	}
	// GPURebootRequired, which the repair condition replaces, and the kubelet's Ready.
	for _, typ := range []string{gpuhealthv1.ConditionGPURebootRequired, "Ready"} {
		if err := patchNode(ctx, as, node, conditionPatch(typ, "True"), "status"); err == nil || !deniedByPolicy(err) ||
			!strings.Contains(err.Error(), string(acceleratedHardwareReady)) {
			t.Errorf("the agent writing %s: %v, want denied by the policy naming the conditions it may write", typ, err)
		}
	}

	kubeconfig := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentSetup{node: node, gpus: 2, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		agentConfig: repairConditionConfig, scenario: "events:\n  - {at: 5s, gpu: 1, xid: 79}\n"})
	eventually(t, "AcceleratedHardwareReady True, NoRepairRequired, before the fault", func(ctx context.Context) (bool, string, error) {
		cond, err := nodeCondition(ctx, c, node, acceleratedHardwareReady)
		return cond.Status == corev1.ConditionTrue && cond.Reason == gpuhealthv1.ReasonNoRepairRequired, fmt.Sprintf("%+v", cond), err
	})
	eventually(t, "AcceleratedHardwareReady False, RebootRequired, for GPU 1", func(ctx context.Context) (bool, string, error) {
		cond, err := nodeCondition(ctx, c, node, acceleratedHardwareReady)
		return cond.Status == corev1.ConditionFalse && cond.Reason == gpuhealthv1.ReasonRebootRequired &&
				strings.Contains(cond.Message, "GPU 1 ("+uuids[1]+") needs the node rebooted") && strings.Contains(cond.Message, "fallen off the bus"),
			fmt.Sprintf("%+v", cond), err
	})
	unhealthy, err := nodeCondition(ctx, c, node, nodecondition.Type)
	if err != nil || unhealthy.Status != corev1.ConditionTrue {
		t.Errorf("GPUUnhealthy %+v (%v), want True beside the repair condition", unhealthy, err)
	}
	if reboot, err := nodeCondition(ctx, c, node, nodecondition.RebootType); err != nil || reboot.Type != "" {
		t.Errorf("GPURebootRequired %+v (%v): the repair condition replaces it", reboot, err)
	}
}

// TestRepairConditionHeldByTheBreakerInAWave: four nodes of two GPUs each, the circuit breaker
// allowing a quarter of the eight GPUs (2) within its window, and GPU 0 of every node falling
// off the bus at once. Exactly two nodes ask for a reboot (AcceleratedHardwareReady False,
// RebootRequired); the other two stay True with RepairHeldByCircuitBreaker, and a watch of every
// Node update proves no third node asked for a repair at any moment, however briefly: a repair
// engine would have replaced it. After `gpuhealth breaker ack` every sick node asks. With DRA
// devices the device-taint reporter asks the breaker first and the repair condition finds its
// slot; without (the device plugin's clusters, most EKS and Karpenter ones) the repair
// condition's own question is the only guard.
func TestRepairConditionHeldByTheBreakerInAWave(t *testing.T) {
	t.Parallel()
	for _, dra := range []bool{true, false} {
		name := "DRA devices"
		if !dra {
			name = "no DRA devices"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			repairWave(t, dra)
		})
	}
}

func repairWave(t *testing.T, dra bool) {
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true})
	ctx := t.Context()
	const gpus, budget = 2, 2
	nodes := []string{"repair-wave-0", "repair-wave-1", "repair-wave-2", "repair-wave-3"}
	uuids := map[string][]string{}
	for _, n := range nodes {
		if dra {
			uuids[n] = gpuNode(t, c, n, gpus)
			continue
		}
		if _, err := c.CreateReadyNode(ctx, n, nil); err != nil {
			t.Fatal(err)
		}
		uuids[n] = []string{sim.GPUUUID(n, 0), sim.GPUUUID(n, 1)}
	}
	t.Cleanup(func() { dumpRepairState(t, c, nodes...) })
	kubeconfigs := map[string]string{}
	for _, n := range nodes {
		kubeconfigs[n] = agentKubeconfigOnNode(t, c, n)
	}
	grantBreakerRole(t, c)
	startBreakerController(t, c)
	asked := watchRepairRequests(t, c)

	for _, n := range nodes {
		startAgent(t, agentSetup{node: n, gpus: gpus, kubeconfig: kubeconfigs[n], checkpoint: filepath.Join(t.TempDir(), n+".ckpt"),
			breakerFraction: 0.25, agentConfig: repairConditionConfig,
			scenario: "events:\n  - {at: 15s, gpu: 0, xid: 79}\n"})
	}
	eventually(t, "the breaker controller counts the cluster's 8 GPUs", func(ctx context.Context) (bool, string, error) {
		cm, err := c.Admin().CoreV1().ConfigMaps(agentNamespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		n, _ := breaker.ParseState(cm)
		return n == len(nodes)*gpus, fmt.Sprintf("count %d", n), nil
	})
	repairs := func(ctx context.Context) (map[string]corev1.NodeCondition, error) {
		out := map[string]corev1.NodeCondition{}
		for _, n := range nodes {
			cond, err := nodeCondition(ctx, c, n, acceleratedHardwareReady)
			if err != nil {
				return nil, err
			}
			out[n] = cond
		}
		return out, nil
	}
	eventuallyWithin(t, pollTimeout+15*time.Second, "the budget's two nodes ask for a reboot, the other two are held", func(ctx context.Context) (bool, string, error) {
		conds, err := repairs(ctx)
		if err != nil {
			return false, "", err
		}
		byReason := map[string][]string{}
		for n, cond := range conds {
			byReason[string(cond.Status)+"/"+cond.Reason] = append(byReason[string(cond.Status)+"/"+cond.Reason], n)
		}
		return len(byReason["False/"+gpuhealthv1.ReasonRebootRequired]) == budget && len(byReason["True/"+gpuhealthv1.ReasonRepairHeldByCircuitBreaker]) == len(nodes)-budget,
			fmt.Sprint(byReason), nil
	})
	conds, err := repairs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for n, cond := range conds {
		if cond.Reason == gpuhealthv1.ReasonRepairHeldByCircuitBreaker && !strings.Contains(cond.Message, "GPU 0 ("+uuids[n][0]+") needs the node rebooted") {
			t.Errorf("%s: held, but the message does not say which GPU needs what: %q", n, cond.Message)
		}
		if !dra {
			continue // no DRA device to taint: GPUCircuitBreakerOpen speaks of taints only
		}
		if open, err := nodeCondition(ctx, c, n, nodecondition.BreakerType); err != nil ||
			(cond.Reason == gpuhealthv1.ReasonRepairHeldByCircuitBreaker) != (open.Status == corev1.ConditionTrue) {
			t.Errorf("%s: repair condition %s, but GPUCircuitBreakerOpen %+v (%v)", n, cond.Reason, open, err)
		}
	}
	slots, err := breaker.ListSlots(ctx, adapt.Clientset(c.Admin()), agentNamespace)
	if err != nil || len(slots) != budget {
		t.Errorf("breaker slots %+v (%v), want the budget's %d: one a GPU, whoever asked first", slots, err, budget)
	}
	if got := asked.before(); len(got) != budget {
		t.Errorf("nodes that asked for a repair at any moment before the acknowledgement: %v, want the budget's %d", got, budget)
	}

	asked.acknowledge()
	if out, stderr, code := gpuhealthCLI(t, "breaker", "ack", "--kubeconfig", c.AdminKubeconfig(), "-n", agentNamespace); code != 0 {
		t.Fatalf("breaker ack: exit %d, %q %q", code, out, stderr)
	}
	eventually(t, "after the acknowledgement every sick node asks for a reboot", func(ctx context.Context) (bool, string, error) {
		conds, err := repairs(ctx)
		if err != nil {
			return false, "", err
		}
		n := 0
		for _, cond := range conds {
			if cond.Status == corev1.ConditionFalse && cond.Reason == gpuhealthv1.ReasonRebootRequired {
				n++
			}
		}
		return n == len(nodes), fmt.Sprint(conds), nil
	})
}

// grantBreakerRole gives the agents' ServiceAccount the circuit breaker's Role (its ConfigMap and
// slots), as the chart does with the breaker on.
func grantBreakerRole(t *testing.T, c *controlplane.Cluster) {
	t.Helper()
	ctx := t.Context()
	const name = "gpuhealth-agent-breaker"
	rbac := c.Admin().RbacV1()
	if _, err := rbac.Roles(agentNamespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: name},
		Rules: agent.BreakerRoleRules()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(agentNamespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNamespace, Name: "gpuhealth-agent"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// repairRequests records, from a watch of every Node update, the nodes whose repair condition
// asked for a repair (AcceleratedHardwareReady False) before the test acknowledged the breaker.
type repairRequests struct {
	t     *testing.T
	acked atomic.Bool
	// ended is set when the watch ended before the test did: what it saw is then not everything.
	ended atomic.Bool
	mu    sync.Mutex
	nodes map[string]bool
}

func (r *repairRequests) acknowledge() { r.acked.Store(true) }

// before returns the nodes that asked before the acknowledgement; a watch that ended early
// fails the test, since a request could have gone unseen.
func (r *repairRequests) before() []string {
	r.t.Helper()
	if r.ended.Load() {
		r.t.Error("the watch of the Nodes ended early: a repair request may have gone unseen")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.nodes))
}

// watchRepairRequests watches every Node (resuming from the last version seen if the server
// closes the watch) until the test ends.
func watchRepairRequests(t *testing.T, c *controlplane.Cluster) *repairRequests {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	list, err := c.Admin().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return c.Admin().CoreV1().Nodes().Watch(ctx, o)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &repairRequests{t: t, nodes: map[string]bool{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if ctx.Err() == nil {
				r.ended.Store(true)
			}
		}()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				// The retry watcher resumes from the last version after a closed watch; an error
				// it passes on is one it cannot resume from (the version expired).
				r.ended.Store(true)
				continue
			}
			node, ok := ev.Object.(*corev1.Node)
			if !ok || r.acked.Load() {
				continue
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == acceleratedHardwareReady && cond.Status == corev1.ConditionFalse {
					r.mu.Lock()
					r.nodes[node.Name] = true
					r.mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		cancel()
		<-done
	})
	return r
}

// dumpRepairState logs, when the test failed, the nodes' conditions and the breaker's state.
func dumpRepairState(t *testing.T, c *controlplane.Cluster, nodes ...string) {
	if !t.Failed() {
		return
	}
	ctx := context.Background()
	for _, n := range nodes {
		node, err := c.Admin().CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Logf("node %s: %v", n, err)
			continue
		}
		for _, cond := range node.Status.Conditions {
			t.Logf("node %s: %s=%s %s: %s", n, cond.Type, cond.Status, cond.Reason, cond.Message)
		}
		t.Logf("node %s: unhealthy ids %q", n, node.Annotations[gpuhealthv1.UnhealthyIDsKey])
	}
	if cm, err := c.Admin().CoreV1().ConfigMaps(agentNamespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{}); err == nil {
		t.Logf("breaker ConfigMap: %v", cm.Data)
	}
	if slots, err := breaker.ListSlots(ctx, adapt.Clientset(c.Admin()), agentNamespace); err == nil {
		for _, s := range slots {
			t.Logf("breaker slot %d: %s/%s at %s", s.Index, s.Node, s.UUID, s.At.Format(time.RFC3339))
		}
	}
}
