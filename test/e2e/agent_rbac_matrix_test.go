//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/report/claimstatus"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// What a request of the matrix must meet.
const (
	allowed      = "allowed"
	byRBAC       = "RBAC"                  // Forbidden: no rule grants it
	byDriverAuth = "resourceclaims/driver" // the API server's associated-node check on status.devices
	byBindAuth   = "resourceclaims/binding"
)

// TestAgentRBACMatrix installs the chart with its default values on a real API server (RBAC and
// admission policy as rendered) and sends, with the token of node A's agent pod (bound to the
// pod, as the kubelet projects it), every request of the matrix below for real. The default
// install lets an agent read no pod at all, of any node (the item of issue #45: the claimstatus
// reporter used to watch pods, and a pod list returns every pod's spec and environment); it may
// read a claim by name, of any node (RBAC cannot confine a get by node; docs/helm.md says so), and
// write device status only on claims allocated on its own node. Then a real agent under exactly
// these permissions marks the claim of a pod on its real kubelet node whose GPU fails, having
// found it through the kubelet's pod-resources API. Finally the chart with
// config.agent.claimStatus.podWatch shows the matrix sees a pod grant when there is one.
func TestAgentRBACMatrix(t *testing.T) {
	t.Parallel()
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace})
	c := controlplane.StartT(t, controlplane.Options{
		KubeletNodes: 1,
		// The defaults, the node-lifecycle controller real nodes need, and the policy's type checker.
		Controllers: append(controlplane.DefaultControllers(), "node-lifecycle-controller", "validatingadmissionpolicy-status-controller"),
	})
	ctx := t.Context()
	admin := c.Admin()
	nodeA := c.KubeletNode(controlplane.KubeletNodeName(0))
	const nodeB, tenant = "rbac-node-b", "tenant"

	uuidsA, _ := realGPUNode(t, c, nodeA.Name, 4)
	uuidsB := gpuNode(t, c, nodeB, 4) // no kubelet: its pod is only scheduled
	if _, err := admin.ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, tenant); err != nil {
		t.Fatal(err)
	}
	// A tenant's pods and their claims, on A (running) and on B (scheduled only).
	podA := podWithClaim(t, c, pinnedClaim(tenant, "work-a", uuidsA[2], ""), nodeA.Name)
	podB := podWithClaim(t, c, pinnedClaim(tenant, "work-b", uuidsB[1], ""), nodeB)
	waitAllocated(t, c, tenant, "work-a", controlplane.GPUDeviceName(2))
	waitAllocated(t, c, tenant, "work-b", controlplane.GPUDeviceName(1))
	waitPodRunning(t, c, tenant, podA.Name)

	if _, err := c.CreateNamespace(ctx, helmNamespace); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, helmPolicy)
	cfgA := boundAgentConfig(t, c, nodeA.Name)
	asA, asB := clientFor(t, cfgA), clientFor(t, boundAgentConfig(t, c, nodeB))
	if got := boundNode(t, asA); got != nodeA.Name {
		t.Fatalf("token bound to a pod on %s carries node-name %q", nodeA.Name, got)
	}
	// RBAC takes effect once the API server's informers have the rules.
	eventually(t, "the chart's RBAC in effect", func(ctx context.Context) (bool, string, error) {
		_, err := asA.CoreV1().Nodes().Get(ctx, nodeA.Name, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err), nil
	})

	onNode := func(node string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()}
	}
	listPods := func(cs kubernetes.Interface, ns string, o metav1.ListOptions) func(context.Context) error {
		return func(ctx context.Context) error { _, err := cs.CoreV1().Pods(ns).List(ctx, o); return err }
	}
	watchPods := func(cs kubernetes.Interface, o metav1.ListOptions) func(context.Context) error {
		return func(ctx context.Context) error {
			w, err := cs.CoreV1().Pods("").Watch(ctx, o)
			if err == nil {
				w.Stop()
			}
			return err
		}
	}
	getClaim := func(name string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := asA.ResourceV1().ResourceClaims(tenant).Get(ctx, name, metav1.GetOptions{})
			return err
		}
	}
	cases := []struct {
		name    string
		want    string
		request func(ctx context.Context) error
	}{
		// Pods: none, of any node, in any way.
		{"list every pod", byRBAC, listPods(asA, "", metav1.ListOptions{})},
		{"list the pods of node B", byRBAC, listPods(asA, "", onNode(nodeB))},
		{"list the pods of its own node", byRBAC, listPods(asA, "", onNode(nodeA.Name))},
		{"list the pods of a namespace", byRBAC, listPods(asA, tenant, metav1.ListOptions{})},
		{"B's agent lists the pods of node A", byRBAC, listPods(asB, "", onNode(nodeA.Name))},
		{"watch the pods of its own node", byRBAC, watchPods(asA, onNode(nodeA.Name))},
		{"watch every pod", byRBAC, watchPods(asA, metav1.ListOptions{})},
		{"get a pod on node B", byRBAC, func(ctx context.Context) error {
			_, err := asA.CoreV1().Pods(tenant).Get(ctx, podB.Name, metav1.GetOptions{})
			return err
		}},
		{"get a pod on its own node", byRBAC, func(ctx context.Context) error {
			_, err := asA.CoreV1().Pods(tenant).Get(ctx, podA.Name, metav1.GetOptions{})
			return err
		}},
		{"evict a pod on its own node (eviction is off)", byRBAC, func(ctx context.Context) error {
			return asA.CoreV1().Pods(tenant).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: podA.Name}})
		}},
		// Claims: read by name only; device status only on its own node's.
		{"list every claim", byRBAC, func(ctx context.Context) error {
			_, err := asA.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"watch every claim", byRBAC, func(ctx context.Context) error {
			w, err := asA.ResourceV1().ResourceClaims("").Watch(ctx, metav1.ListOptions{})
			if err == nil {
				w.Stop()
			}
			return err
		}},
		{"get a claim of its own node (claimstatus reads the claims the kubelet names)", allowed, getClaim("work-a")},
		{"get a claim of node B (open: RBAC cannot confine a get by node)", allowed, getClaim("work-b")},
		{"write device status on a claim of its own node", allowed, func(ctx context.Context) error {
			return applyDeviceProbe(ctx, asA, tenant, "work-a", nodeA.Name, controlplane.GPUDeviceName(2))
		}},
		{"write device status on a claim of node B", byDriverAuth, func(ctx context.Context) error {
			return applyDeviceProbe(ctx, asA, tenant, "work-b", nodeB, controlplane.GPUDeviceName(1))
		}},
		{"take back the allocation of a claim of its own node", byBindAuth, func(ctx context.Context) error {
			_, err := asA.ResourceV1().ResourceClaims(tenant).Patch(ctx, "work-a", types.MergePatchType, []byte(`{"status":{"allocation":null}}`), metav1.PatchOptions{}, "status")
			return err
		}},
		// The rest of the default install, for the table in docs/helm.md.
		{"list secrets", byRBAC, func(ctx context.Context) error {
			_, err := asA.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list ConfigMaps", byRBAC, func(ctx context.Context) error {
			_, err := asA.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list Leases (the breaker is off)", byRBAC, func(ctx context.Context) error {
			_, err := asA.CoordinationV1().Leases(helmNamespace).List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list Nodes (its own Node's cache; peers of its NVLink domain)", allowed, func(ctx context.Context) error {
			_, err := asA.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list ResourceSlices (its GPUs' DRA devices)", allowed, func(ctx context.Context) error {
			_, err := asA.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"list DeviceTaintRules (its own, at start and every resync)", allowed, func(ctx context.Context) error {
			_, err := asA.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
			return err
		}},
		{"create an Event about its Node in default", allowed, func(ctx context.Context) error { return createNodeEvent(ctx, asA, metav1.NamespaceDefault, nodeA.Name) }},
		{"create an Event in a tenant's namespace", byRBAC, func(ctx context.Context) error { return createNodeEvent(ctx, asA, tenant, nodeA.Name) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.request(t.Context())
			switch tc.want {
			case allowed:
				if err != nil {
					t.Fatalf("want allowed, got %v", err)
				}
			case byRBAC:
				if !apierrors.IsForbidden(err) || deniedByPolicy(err) {
					t.Fatalf("want Forbidden by RBAC, got %v", err)
				}
			default:
				if (!apierrors.IsForbidden(err) && !apierrors.IsInvalid(err)) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("want denied by the API server's %s check, got %v", tc.want, err)
				}
			}
		})
	}

	// A real agent with A's bound token, under the default chart's RBAC and policy: the GPU of
	// the claim on its node fails, and the claim gets the condition, found without reading pods.
	kubeconfig := filepath.Join(t.TempDir(), "agent-a.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfgA); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentSetup{node: nodeA.Name, gpus: 4, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: claimStatusConfig(nodeA.PodResourcesSocket()), scenario: "events:\n  - {at: 1s, gpu: 2, xid: 48}\n"})
	eventually(t, "the claim on A's sick GPU carries the condition", func(ctx context.Context) (bool, string, error) {
		claim, err := admin.ResourceV1().ResourceClaims(tenant).Get(ctx, "work-a", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		cond, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return ok && cond.Reason == claimstatus.ReasonUnhealthy, fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
	if msgs, err := evictionEvents(ctx, c, metav1.NamespaceDefault, nodeA.Name, claimstatus.EventUnavailable); err != nil || len(msgs) > 0 {
		t.Errorf("the agent could not find its node's claims: %q (%v)", msgs, err)
	}
	if claim, err := admin.ResourceV1().ResourceClaims(tenant).Get(ctx, "work-b", metav1.GetOptions{}); err != nil || len(claim.Status.Devices) > 0 {
		t.Errorf("B's claim got device status: %v %+v", err, claim)
	}

	// The chart with a pod watch for claims grants what the default does not, and the matrix
	// sees it: A's token may then list the pods of node B.
	applyManifest(t, c, renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace, Set: []string{"config.agent.claimStatus.podWatch=true"}}))
	eventually(t, "with podWatch, A's agent may list the pods of node B", func(ctx context.Context) (bool, string, error) {
		err := listPods(asA, "", onNode(nodeB))(ctx)
		return err == nil, fmt.Sprint(err), nil
	})
}

// applyDeviceProbe writes a condition of its own (field manager rbac-matrix) into the status of
// device in the claim, as a driver or the agent's claimstatus reporter writes status.devices.
func applyDeviceProbe(ctx context.Context, cs kubernetes.Interface, ns, name, pool, device string) error {
	body := fmt.Sprintf(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"namespace":%q,"name":%q},`+
		`"status":{"devices":[{"driver":%q,"pool":%q,"device":%q,"conditions":[{"type":"example.com/Probe","status":"True","reason":"Probe","message":"authorization matrix","lastTransitionTime":"2026-12-01T00:00:00Z"}]}]}}`,
		ns, name, controlplane.GPUDriver, pool, device)
	_, err := cs.ResourceV1().ResourceClaims(ns).Patch(ctx, name, types.ApplyPatchType, []byte(body),
		metav1.PatchOptions{FieldManager: "rbac-matrix", Force: ptr.To(true)}, "status")
	return err
}

func createNodeEvent(ctx context.Context, cs kubernetes.Interface, ns, node string) error {
	_, err := cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, GenerateName: "rbac-matrix-"},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node},
		Reason:         "RBACMatrix", Message: "authorization matrix", Type: corev1.EventTypeNormal,
		Source: corev1.EventSource{Component: "gpuhealth-agent", Host: node},
	}, metav1.CreateOptions{})
	return err
}
