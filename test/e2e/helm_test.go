//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

// The release the e2e tests install: its agent ServiceAccount is
// system:serviceaccount:gpuhealth-helm:gpuhealth-agent.
const (
	helmRelease   = "gpuhealth"
	helmNamespace = "gpuhealth-helm"
	helmAgentSA   = "gpuhealth-agent"
	helmPolicy    = "gpuhealth-agent-own-node"
)

// TestHelmChartConfinesAgentToItsNode renders the chart, applies every object to a real API
// server, and then acts as the agent of node A with a ServiceAccount token bound to a Pod on A:
// RBAC and the ValidatingAdmissionPolicy together must let it write its own Node's health and
// nothing else. Finally a real agent runs under exactly these permissions and reports a fault.
func TestHelmChartConfinesAgentToItsNode(t *testing.T) {
	t.Parallel()
	// The breaker and remediation on too, so that their Roles, the controller's objects and the
	// policy's Lease rules are applied to a real API server.
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace,
		Set: []string{"config.agent.circuitBreaker.enabled=true", "config.remediation.enabled=true", "config.remediation.maxConcurrent=2",
			"config.remediation.pauseOperatorComponents=true"}})
	// Only the controllers the test needs: the policy's type checker, and the ServiceAccount
	// controller the harness waits for.
	c := controlplane.StartT(t, controlplane.Options{
		DisableScheduler: true,
		Controllers:      []string{"serviceaccount", "validatingadmissionpolicy-status-controller"},
	})
	ctx := t.Context()
	admin := c.Admin()

	const nodeA, nodeB = "helm-node-a", "helm-node-b"
	uuidsA := gpuNode(t, c, nodeA, 2)
	gpuNode(t, c, nodeB, 2)

	if _, err := c.CreateNamespace(ctx, helmNamespace); err != nil {
		t.Fatal(err)
	}
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, helmPolicy)
	// GPURecords, and a grant that lets the agent write them (as a careless ClusterRole might):
	// the policy still denies every write.
	installGPURecordCRD(t, c)
	grantTooMuch := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "too-much-gpurecords"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{gpurecord.Group}, Resources: []string{gpurecord.Resource}, Verbs: []string{"create", "update", "delete"}}}}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, grantTooMuch, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: grantTooMuch.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: grantTooMuch.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: helmNamespace, Name: helmAgentSA}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Tokens as the kubelet would mint them for the agent pods on A and B, and one bound to no pod.
	cfgA := boundAgentConfig(t, c, nodeA)
	cfgB := boundAgentConfig(t, c, nodeB)
	unbound, err := c.ServiceAccountConfig(ctx, helmNamespace, helmAgentSA)
	if err != nil {
		t.Fatal(err)
	}
	asA, asB, asUnbound := clientFor(t, cfgA), clientFor(t, cfgB), clientFor(t, unbound)
	if got := boundNode(t, asA); got != nodeA {
		t.Fatalf("token bound to a pod on %s carries node-name %q", nodeA, got)
	}

	// An admin's drain and a foreign annotation on A, and a rule of B's, for the agent to leave alone.
	mergePatchNode(t, admin, nodeA, map[string]any{gpuhealthv1.DrainsKey: `{"GPU-x":{"by":"admin"}}`, "example.com/other": "keep"})
	// Operators' clear requests on A and B: A's agent may remove A's, and nothing else of them.
	clearsA := `{"GPU-x":[{"index":0,"reason":"false positive","by":"admin","at":"2026-11-30T10:00:00Z"}]}`
	// And validation requests (gpuhealth validate), alike.
	validateA := `{"GPU-x":{"index":0,"reason":"after RMA","by":"admin"}}`
	for _, n := range []string{nodeA, nodeB} {
		mergePatchNode(t, admin, n, map[string]any{gpuhealthv1.ClearsKey: clearsA, gpuhealthv1.ValidationRequestsKey: validateA})
	}
	// The GPU operator's DCGM runs on A and B: with pauseOperatorComponents A's agent may pause
	// its label on A (to paused-by-gpuhealth) and give it back, and nothing else of A's labels.
	for _, n := range []string{nodeA, nodeB} {
		mergePatchNodeLabels(t, c, n, map[string]any{"nvidia.com/gpu.deploy.dcgm": "true"})
	}
	labelPatch := func(k, v string) string { return fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, k, v) }
	ruleOfB := policyRule("rule-of-b", nodeB, nodeB)
	if _, err := admin.ResourceV1().DeviceTaintRules().Create(ctx, ruleOfB, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Slots of B's, and the breaker controller's leader Lease, for A's agent to leave alone.
	slotOfB := slotLease(breaker.SlotPrefix+"0", nodeB, 0)
	repairOfB := slotLease(remediation.SlotName(0), nodeB, 300)
	leader := slotLease("gpuhealth-breaker-controller", "controller-0", 15)
	// And the agents' heartbeat Leases (their agents renew them from here on).
	for _, l := range []*coordinationv1.Lease{slotOfB, repairOfB, leader, heartbeatLease(nodeA, nodeA), heartbeatLease(nodeB, nodeB)} {
		if _, err := admin.CoordinationV1().Leases(helmNamespace).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A's rules must be named after its node (the policy), as devicetaint.RuleName does.
	own := func(name string) string { return devicetaint.RulePrefix(nodeA) + name }

	// The policy takes effect once the API server's policy informer has it; wait for a denial.
	waitDenied(t, "the policy to be enforced", func(ctx context.Context) error {
		return patchAnnotations(ctx, asA, nodeB, map[string]any{gpuhealthv1.UnhealthyIDsKey: "0"})
	})

	owned := map[string]any{gpuhealthv1.UnhealthyIDsKey: "1", gpuhealthv1.HealthKey: `{"GPU-1":{"health":"Unhealthy"}}`}
	cases := []struct {
		name    string
		request func(ctx context.Context) error
		// denied: "" means the request must succeed; otherwise the policy must deny it with a
		// message containing this text.
		denied string
	}{
		{"own node: gpuhealth annotations", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, owned)
		}, ""},
		{"own node: remove gpuhealth annotations", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.UnhealthyIDsKey: nil})
		}, ""},
		{"other node: gpuhealth annotation", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeB, owned)
		}, "may not change Node " + nodeB},
		{"own node: foreign annotation", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{"example.com/other": "changed"})
		}, "example.com/other"},
		{"own node: add an annotation", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{"example.com/new": "x"})
		}, "example.com/new"},
		{"own node: undrain (the drains annotation is the operator's)", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.DrainsKey: nil})
		}, gpuhealthv1.DrainsKey},
		{"own node: change the clear requests (they are the operators')", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.ClearsKey: `{"GPU-a0":[{"index":0,"reason":"the agent's own","by":"agent"}]}`})
		}, "not " + gpuhealthv1.ClearsKey},
		{"other node: remove its clear requests", func(ctx context.Context) error {
			return removeClears(ctx, asA, nodeB, clearsA)
		}, "may not change Node " + nodeB},
		{"own node: remove the clear requests it applied, as the agent does", func(ctx context.Context) error {
			return removeClears(ctx, asA, nodeA, clearsA)
		}, ""},
		{"own node: add a clear request", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.ClearsKey: clearsA})
		}, "not " + gpuhealthv1.ClearsKey},
		{"node B's agent: add a clear request to its own node's", func(ctx context.Context) error {
			return patchAnnotations(ctx, asB, nodeB, map[string]any{gpuhealthv1.ClearsKey: `{"GPU-x":[{"index":0,"reason":"r","by":"agent"},{"index":1,"reason":"r","by":"agent"}]}`})
		}, "not " + gpuhealthv1.ClearsKey},
		{"own node: change the validation requests (they are the operators')", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.ValidationRequestsKey: `{"GPU-x":{"index":0,"reason":"the agent's own","by":"agent"}}`})
		}, "not " + gpuhealthv1.ValidationRequestsKey},
		{"other node: remove its validation requests", func(ctx context.Context) error {
			return removeValidationRequests(ctx, asA, nodeB, validateA)
		}, "may not change Node " + nodeB},
		{"own node: remove the validation requests it applied, as the agent does", func(ctx context.Context) error {
			return removeValidationRequests(ctx, asA, nodeA, validateA)
		}, ""},
		{"own node: add a validation request", func(ctx context.Context) error {
			return patchAnnotations(ctx, asA, nodeA, map[string]any{gpuhealthv1.ValidationRequestsKey: validateA})
		}, "not " + gpuhealthv1.ValidationRequestsKey},
		{"own node: labels", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, `{"metadata":{"labels":{"nvidia.com/gpu.present":"false"}}}`, "")
		}, "labels nvidia.com/gpu.present"},
		{"own node: pause a GPU operator component for a reset", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, labelPatch("nvidia.com/gpu.deploy.dcgm", remediation.ComponentPausedValue), "")
		}, ""},
		{"own node: set a component's label to anything else", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, labelPatch("nvidia.com/gpu.deploy.dcgm-exporter", "false"), "")
		}, "nvidia.com/gpu.deploy.dcgm-exporter"},
		{"own node: give the paused component its value back", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, labelPatch("nvidia.com/gpu.deploy.dcgm", "true"), "")
		}, ""},
		{"own node: pause the driver (not a GPU client: pausing it unloads it)", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, labelPatch("nvidia.com/gpu.deploy.driver", remediation.ComponentPausedValue), "")
		}, "nvidia.com/gpu.deploy.driver"},
		{"own node: switch a running component off", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, labelPatch("nvidia.com/gpu.deploy.dcgm", "false"), "")
		}, "nvidia.com/gpu.deploy.dcgm"},
		{"other node: pause its component", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeB, labelPatch("nvidia.com/gpu.deploy.dcgm", remediation.ComponentPausedValue), "")
		}, "may not change Node " + nodeB},
		{"own node: spec (cordon)", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, `{"spec":{"unschedulable":true}}`, "")
		}, "spec"},
		{"own node: GPUUnhealthy condition", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, conditionPatch(string(nodecondition.Type), "True"), "status")
		}, ""},
		{"own node: the circuit breaker's condition (the breaker is on)", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, conditionPatch(gpuhealthv1.ConditionCircuitBreakerOpen, "True"), "status")
		}, ""},
		{"own node: Ready condition", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, conditionPatch("Ready", "False"), "status")
		}, "GPUUnhealthy"},
		{"own node: status capacity", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, `{"status":{"capacity":{"nvidia.com/gpu":"0"}}}`, "status")
		}, "GPUUnhealthy"},
		{"own node: foreign annotation through nodes/status", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeA, `{"metadata":{"annotations":{"example.com/other":"changed"}}}`, "status")
		}, "example.com/other"},
		{"other node: GPUUnhealthy condition", func(ctx context.Context) error {
			return patchNode(ctx, asA, nodeB, conditionPatch(string(nodecondition.Type), "True"), "status")
		}, "may not change Node " + nodeB},
		{"rule labelled for the other node", func(ctx context.Context) error {
			return createRule(ctx, asA, policyRule(own("writes-b"), nodeB, nodeB))
		}, "not one labelled for \"" + nodeB + "\""},
		{"rule labelled for its node, selecting the other node's pool", func(ctx context.Context) error {
			return createRule(ctx, asA, policyRule(own("taints-b"), nodeA, nodeB))
		}, "DRA pool " + nodeA},
		{"rule labelled for its node, selecting every pool", func(ctx context.Context) error {
			r := policyRule(own("taints-all"), nodeA, nodeA)
			r.Spec.DeviceSelector.Pool = nil
			return createRule(ctx, asA, r)
		}, "DRA pool " + nodeA},
		{"rule labelled for its node, owned by the other node", func(ctx context.Context) error {
			b, err := admin.CoreV1().Nodes().Get(ctx, nodeB, metav1.GetOptions{})
			if err != nil {
				return err
			}
			r := policyRule(own("owned-by-b"), nodeA, nodeA)
			r.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeB, UID: b.UID}}
			return createRule(ctx, asA, r)
		}, "owned only by its own Node"},
		{"rule labelled for its node", func(ctx context.Context) error {
			return createRule(ctx, asA, policyRule(own("gpu-a"), nodeA, nodeA))
		}, ""},
		{"rule under the name of the other node's GPU (to keep B's own create failing)", func(ctx context.Context) error {
			return createRule(ctx, asA, policyRule(devicetaint.RuleName(nodeB, "GPU-b1"), nodeA, nodeA))
		}, "may create only DeviceTaintRules named " + devicetaint.RulePrefix(nodeA)},
		{"rule under a name of no node", func(ctx context.Context) error {
			return createRule(ctx, asA, policyRule("gpuhealth-gpu-b1", nodeA, nodeA))
		}, "may create only DeviceTaintRules named"},
		{"relabel its rule for the other node", func(ctx context.Context) error {
			return updateRule(ctx, asA, own("gpu-a"), func(r *resourcev1.DeviceTaintRule) { r.Labels[devicetaint.NodeLabel] = nodeB })
		}, "not one labelled for \"" + nodeB + "\""},
		{"update its rule", func(ctx context.Context) error {
			return updateRule(ctx, asA, own("gpu-a"), func(r *resourcev1.DeviceTaintRule) { r.Spec.Taint.Value = "79" })
		}, ""},
		{"update the other node's rule", func(ctx context.Context) error {
			return updateRule(ctx, asA, ruleOfB.Name, func(r *resourcev1.DeviceTaintRule) { r.Spec.Taint.Value = "0" })
		}, "not one labelled for \"" + nodeB + "\""},
		{"delete the other node's rule", func(ctx context.Context) error {
			return asA.ResourceV1().DeviceTaintRules().Delete(ctx, ruleOfB.Name, metav1.DeleteOptions{})
		}, "not one labelled for \"" + nodeB + "\""},
		{"delete its rule", func(ctx context.Context) error {
			return asA.ResourceV1().DeviceTaintRules().Delete(ctx, own("gpu-a"), metav1.DeleteOptions{})
		}, ""},
		// The circuit breaker's and remediation's slots (Leases in the release namespace).
		{"take a breaker slot for its own GPU", func(ctx context.Context) error {
			return createLease(ctx, asA, slotLease(breaker.SlotPrefix+"1", nodeA, 0))
		}, ""},
		{"take a breaker slot for the other node", func(ctx context.Context) error {
			return createLease(ctx, asA, slotLease(breaker.SlotPrefix+"2", nodeB, 0))
		}, "may take slots only for its own node"},
		{"take a breaker slot dated 2099 (counts from its creation anyway)", func(ctx context.Context) error {
			l := slotLease(breaker.SlotPrefix+"3", nodeA, 0)
			l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)))
			return createLease(ctx, asA, l)
		}, ""},
		{"take over the other node's breaker slot", func(ctx context.Context) error {
			return updateLease(ctx, asA, slotOfB.Name, func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(nodeA + "/GPU-a0") })
		}, "may not change a slot Lease"}, // agents update Leases (their heartbeat), never a slot
		{"re-date its own breaker slot", func(ctx context.Context) error {
			return updateLease(ctx, asA, breaker.SlotPrefix+"1", func(l *coordinationv1.Lease) { l.Spec.AcquireTime = ptr.To(metav1.NewMicroTime(time.Now())) })
		}, "may not change a slot Lease"},
		{"renew its own heartbeat Lease", func(ctx context.Context) error {
			return updateLease(ctx, asA, gpuhealthv1.HeartbeatLeaseName(nodeA), func(l *coordinationv1.Lease) { l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now())) })
		}, ""},
		{"renew the other node's heartbeat Lease (to keep a dead agent fresh)", func(ctx context.Context) error {
			return updateLease(ctx, asA, gpuhealthv1.HeartbeatLeaseName(nodeB), func(l *coordinationv1.Lease) { l.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now())) })
		}, "may renew only its own heartbeat Lease"},
		{"create the other node's heartbeat Lease under its own holder", func(ctx context.Context) error {
			return createLease(ctx, asA, heartbeatLease(nodeB, nodeA))
		}, "may renew only its own heartbeat Lease"},
		{"hand its own heartbeat Lease to the other node", func(ctx context.Context) error {
			return updateLease(ctx, asA, gpuhealthv1.HeartbeatLeaseName(nodeA), func(l *coordinationv1.Lease) { l.Spec.HolderIdentity = ptr.To(nodeB) })
		}, "may renew only its own heartbeat Lease"},
		{"delete the other node's heartbeat Lease", func(ctx context.Context) error {
			return asA.CoordinationV1().Leases(helmNamespace).Delete(ctx, gpuhealthv1.HeartbeatLeaseName(nodeB), metav1.DeleteOptions{})
		}, "Forbidden"}, // RBAC: agents never delete a heartbeat
		{"delete the other node's breaker slot", func(ctx context.Context) error {
			return asA.CoordinationV1().Leases(helmNamespace).Delete(ctx, slotOfB.Name, metav1.DeleteOptions{})
		}, "Forbidden"}, // RBAC: only the controller sweeps breaker slots
		{"take a remediation slot for its own GPU", func(ctx context.Context) error {
			return createLease(ctx, asA, slotLease(remediation.SlotName(1), nodeA, 300))
		}, ""},
		{"take a remediation slot for a decade", func(ctx context.Context) error {
			return createLease(ctx, asA, slotLease(remediation.SlotPrefix+"7", nodeA, 10*365*86400))
		}, "at most a day"},
		{"delete the other node's remediation slot", func(ctx context.Context) error {
			return asA.CoordinationV1().Leases(helmNamespace).Delete(ctx, repairOfB.Name, metav1.DeleteOptions{})
		}, "may delete only its own node's slots"},
		{"delete its own remediation slot", func(ctx context.Context) error {
			return asA.CoordinationV1().Leases(helmNamespace).Delete(ctx, remediation.SlotName(1), metav1.DeleteOptions{})
		}, ""},
		{"create a Lease that is no slot", func(ctx context.Context) error {
			return createLease(ctx, asA, slotLease("not-a-slot", nodeA, 15))
		}, "slot Leases"},
		{"delete the breaker controller's leader Lease", func(ctx context.Context) error {
			return asA.CoordinationV1().Leases(helmNamespace).Delete(ctx, leader.Name, metav1.DeleteOptions{})
		}, "Forbidden"},
		{"write an Event outside the default namespace", func(ctx context.Context) error {
			_, err := asA.CoreV1().Events(helmNamespace).Create(ctx, &corev1.Event{
				ObjectMeta:     metav1.ObjectMeta{Name: "forged", Namespace: helmNamespace},
				InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: helmNamespace, Name: "victim"},
				Reason:         "Forged", Message: "x", Type: corev1.EventTypeWarning,
			}, metav1.CreateOptions{})
			return err
		}, "Forbidden"},
		{"node B's agent: its own node", func(ctx context.Context) error {
			return patchAnnotations(ctx, asB, nodeB, owned)
		}, ""},
		{"node B's agent: node A", func(ctx context.Context) error {
			return patchAnnotations(ctx, asB, nodeA, owned)
		}, "may not change Node " + nodeA},
		{"token bound to no pod: own-looking write", func(ctx context.Context) error {
			return patchAnnotations(ctx, asUnbound, nodeA, owned)
		}, "not bound to a Pod on a Node"},
		{"token bound to no pod: rule", func(ctx context.Context) error {
			return createRule(ctx, asUnbound, policyRule("unbound", nodeA, nodeA))
		}, "not bound to a Pod on a Node"},
		{"GPURecords: never written by an agent, whatever RBAC grants", func(ctx context.Context) error {
			records, err := kube.NewGPURecords(cfgA)
			if err != nil {
				return err
			}
			_, err = records.Create(ctx, &gpurecord.GPURecord{ObjectMeta: metav1.ObjectMeta{Name: "1650000000000"}, Serial: "1650000000000"}, metav1.CreateOptions{})
			return err
		}, "may not write GPURecords"},
		{"admin is not subject to the policy", func(ctx context.Context) error {
			return patchAnnotations(ctx, admin, nodeB, map[string]any{"example.com/admin": "ok"})
		}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.request(t.Context())
			switch {
			case tc.denied == "" && err != nil:
				t.Fatalf("want success, got %v", err)
			case tc.denied != "" && err == nil:
				t.Fatalf("want denied by %s (%q), got success", helmPolicy, tc.denied)
			case tc.denied == "Forbidden" && !apierrors.IsForbidden(err):
				t.Fatalf("want Forbidden (RBAC), got %v", err)
			case tc.denied != "" && tc.denied != "Forbidden" && !deniedByPolicy(err):
				t.Fatalf("want denied by %s, got %v", helmPolicy, err)
			case tc.denied != "" && tc.denied != "Forbidden" && !strings.Contains(err.Error(), tc.denied):
				t.Fatalf("denial %q does not mention %q", err, tc.denied)
			}
		})
	}
	ann, err := nodeAnnotations(ctx, c, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	if ann[gpuhealthv1.DrainsKey] == "" || ann["example.com/other"] != "keep" {
		t.Fatalf("the agent changed annotations it does not own: %v", ann)
	}
	if _, ok := ann[gpuhealthv1.ClearsKey]; ok {
		t.Fatalf("A's clear requests are still there: %v", ann)
	}
	if annB, err := nodeAnnotations(ctx, c, nodeB); err != nil || annB[gpuhealthv1.ClearsKey] != clearsA || annB[gpuhealthv1.ValidationRequestsKey] != validateA {
		t.Fatalf("B's clear or validation requests changed: %v %v", annB, err)
	}
	if _, ok := ann[gpuhealthv1.ValidationRequestsKey]; ok {
		t.Fatalf("A's validation requests are still there: %v", ann)
	}

	// A real agent with node A's bound token, under the chart's RBAC and policy, reports a fault
	// on every sink.
	kubeconfig := filepath.Join(t.TempDir(), "agent-a.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfgA); err != nil {
		t.Fatal(err)
	}
	mergePatchNode(t, admin, nodeA, map[string]any{gpuhealthv1.UnhealthyIDsKey: nil, gpuhealthv1.HealthKey: nil})
	// Someone (an admin, or another node's agent where the policy is off) holds the name of the
	// rule A's agent is about to write, labelled for B: A's agent may not change it, so it writes
	// its rule under a generated name and says so in an Event.
	squatted := devicetaint.RuleName(nodeA, uuidsA[1])
	if _, err := admin.ResourceV1().DeviceTaintRules().Create(ctx, policyRule(squatted, nodeB, nodeB), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startAgent(t, agentSetup{
		node: nodeA, gpus: 2, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 1s, gpu: 1, xid: 48}\n",
	})
	eventually(t, "the agent's fault report on node A", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, nodeA)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, nodeA)
		if err != nil {
			return false, "", err
		}
		cond, err := nodeCondition(ctx, c, nodeA, nodecondition.Type)
		if err != nil {
			return false, "", err
		}
		r, ok := rs[squatted]
		return ann[gpuhealthv1.UnhealthyIDsKey] == "1" && ok && r.Name != squatted && r.Spec.Taint.Value == "48" && cond.Status == corev1.ConditionTrue,
			fmt.Sprintf("ids=%q rules=%v condition=%q", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs), cond.Status), nil
	})
	eventually(t, "the Event that the rule's name was taken", func(ctx context.Context) (bool, string, error) {
		list, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeA + ",reason=DeviceTaintRuleNameTaken"})
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 1 && strings.Contains(list.Items[0].Message, squatted), fmt.Sprint(len(list.Items), " events"), nil
	})
	if r, err := admin.ResourceV1().DeviceTaintRules().Get(ctx, squatted, metav1.GetOptions{}); err != nil || r.Labels[devicetaint.NodeLabel] != nodeB {
		t.Errorf("the rule holding the name was changed: %v %+v", err, r)
	}

	// An operator clears the fault: the agent applies the request and removes it, under the
	// chart's RBAC and policy.
	mergePatchNode(t, admin, nodeA, map[string]any{gpuhealthv1.ClearsKey: `{"` + uuidsA[1] + `":[{"index":1,"condition":"XID48","reason":"false positive","by":"admin","at":"` + time.Now().UTC().Format(time.RFC3339) + `"}]}`})
	eventually(t, "the clear applied and its request removed by A's agent", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, nodeA)
		if err != nil {
			return false, "", err
		}
		events, err := admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeA + ",reason=" + gpuhealthv1.EventConditionsCleared})
		if err != nil {
			return false, "", err
		}
		_, pending := ann[gpuhealthv1.ClearsKey]
		_, ids := ann[gpuhealthv1.UnhealthyIDsKey]
		return !pending && !ids && len(events.Items) == 1, fmt.Sprintf("pending=%v ids=%q events=%d", pending, ann[gpuhealthv1.UnhealthyIDsKey], len(events.Items)), nil
	})
}

// renderChart runs helm template, skipping the test when no helm can be built.
func renderChart(t *testing.T, o helm.Options) string {
	t.Helper()
	if _, err := helm.Binary(); err != nil {
		t.Skipf("no helm tool (hack/tools.sh install helm builds it from Go modules): %v", err)
	}
	out, err := helm.Template(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// applyManifest server-side applies every rendered object as the admin, in the rendered order
// (helm sorts ServiceAccounts and RBAC before workloads). Nothing runs the pods: there is no
// kubelet, and the test nodes lack the GPU label the DaemonSet selects.
func applyManifest(t *testing.T, c *controlplane.Cluster, manifest string) {
	t.Helper()
	ctx := t.Context()
	objs, dyn, mapper := manifestClients(t, c, manifest)
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: "helm-e2e", Force: true}); err != nil {
			t.Fatalf("apply %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	t.Logf("applied %d rendered objects", len(objs))
}

// waitPolicyTypeChecked waits for the API server's type check of the policy and fails on any
// warning: a misspelt field would otherwise only show up as a runtime error (and, with
// failurePolicy Fail, as a denial of everything the agent does).
func waitPolicyTypeChecked(t *testing.T, c *controlplane.Cluster, name string) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.Admin().AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = fmt.Sprintf("generation %d, observed %d", p.Generation, p.Status.ObservedGeneration)
		if p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
			return false, nil
		}
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s: %s: %s", name, w.FieldRef, w.Warning)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("policy %s never type-checked: %v (%s)", name, err, last)
	}
}

// boundAgentConfig creates a Pod of the agent's ServiceAccount on node and returns a rest.Config
// with a token bound to that Pod, as the kubelet projects into the agent's container.
func boundAgentConfig(t *testing.T, c *controlplane.Cluster, node string) *rest.Config {
	t.Helper()
	ctx := t.Context()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: helmNamespace, Name: "agent-" + node},
		Spec: corev1.PodSpec{
			ServiceAccountName: helmAgentSA,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "agent", Image: "gpuhealth:e2e"}},
		},
	}
	pod, err := c.Admin().CoreV1().Pods(helmNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Admin().CoreV1().ServiceAccounts(helmNamespace).CreateToken(ctx, helmAgentSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr.To[int64](3600),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.AdminConfig())
	cfg.BearerToken = tr.Status.Token
	return cfg
}

func clientFor(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// boundNode asks the API server who the client is and returns the node its token is bound to.
func boundNode(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodes := r.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(nodes) == 1 {
		return nodes[0]
	}
	return ""
}

// deniedByPolicy tells a denial by the admission policy from one by RBAC, which names no policy.
func deniedByPolicy(err error) bool {
	return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), helmPolicy)
}

func waitDenied(t *testing.T, what string, request func(ctx context.Context) error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		last = request(ctx)
		return deniedByPolicy(last), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (last: %v)", what, err, last)
	}
}

func patchAnnotations(ctx context.Context, cs kubernetes.Interface, node string, ann map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	return patchNode(ctx, cs, node, string(body), "")
}

func mergePatchNode(t *testing.T, cs kubernetes.Interface, node string, ann map[string]any) {
	t.Helper()
	if err := patchAnnotations(t.Context(), cs, node, ann); err != nil {
		t.Fatal(err)
	}
}

// patchNode sends a strategic merge patch to the node or, with subresource "status", its status,
// as the agent's condition reporter does.
func patchNode(ctx context.Context, cs kubernetes.Interface, node, body, subresource string) error {
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, sub...)
	return err
}

// removeClears removes the clear requests from node if they are value, with the patch the agent
// sends once it has applied them.
func removeClears(ctx context.Context, cs kubernetes.Interface, node, value string) error {
	return removeRequests(ctx, cs, node, value, agent.ClearsRemovalPatch)
}

// removeValidationRequests is removeClears for the validation requests.
func removeValidationRequests(ctx context.Context, cs kubernetes.Interface, node, value string) error {
	return removeRequests(ctx, cs, node, value, agent.ValidationRequestsRemovalPatch)
}

func removeRequests(ctx context.Context, cs kubernetes.Interface, node, value string, removal func(string) ([]byte, error)) error {
	body, err := removal(value)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, body, metav1.PatchOptions{})
	return err
}

func conditionPatch(typ, status string) string {
	now := time.Now().UTC().Format(time.RFC3339)
	return fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":"E2E","message":"set by the helm e2e test","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`,
		typ, status, now, now)
}

// policyRule is a DeviceTaintRule like the agent's: labelled for labelNode, selecting gpu-0 in
// pool, owned by no one (the owner check is covered by the real agent, which sets its Node).
func policyRule(name, labelNode, pool string) *resourcev1.DeviceTaintRule {
	r := controlplane.GPUDeviceTaintRule(name, pool, controlplane.GPUDeviceName(0),
		resourcev1.DeviceTaint{Key: "gpuhealth.dev/xid", Value: "48", Effect: resourcev1.DeviceTaintEffectNoSchedule})
	r.Labels = map[string]string{devicetaint.NodeLabel: labelNode}
	return r
}

// slotLease is a slot Lease held for node's GPU, for seconds (0: no duration).
func slotLease(name, node string, seconds int32) *coordinationv1.Lease {
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: helmNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(breaker.Holder(node, "GPU-"+node))},
	}
	if seconds > 0 {
		l.Spec.LeaseDurationSeconds = &seconds
	}
	return l
}

// heartbeatLease is the heartbeat Lease of node's agent, held by holder.
func heartbeatLease(node, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: gpuhealthv1.HeartbeatLeaseName(node), Namespace: helmNamespace, Labels: map[string]string{gpuhealthv1.HeartbeatLeaseLabel: "true"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))},
	}
}

func createLease(ctx context.Context, cs kubernetes.Interface, l *coordinationv1.Lease) error {
	_, err := cs.CoordinationV1().Leases(l.Namespace).Create(ctx, l, metav1.CreateOptions{})
	return err
}

func updateLease(ctx context.Context, cs kubernetes.Interface, name string, change func(*coordinationv1.Lease)) error {
	l, err := cs.CoordinationV1().Leases(helmNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	change(l)
	_, err = cs.CoordinationV1().Leases(helmNamespace).Update(ctx, l, metav1.UpdateOptions{})
	return err
}

func createRule(ctx context.Context, cs kubernetes.Interface, r *resourcev1.DeviceTaintRule) error {
	_, err := cs.ResourceV1().DeviceTaintRules().Create(ctx, r, metav1.CreateOptions{})
	return err
}

func updateRule(ctx context.Context, cs kubernetes.Interface, name string, change func(*resourcev1.DeviceTaintRule)) error {
	r, err := cs.ResourceV1().DeviceTaintRules().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	change(r)
	_, err = cs.ResourceV1().DeviceTaintRules().Update(ctx, r, metav1.UpdateOptions{})
	return err
}

// manifestClients decodes a rendered manifest and returns its objects with what reaches any of
// them: a dynamic client and a REST mapper from the API server's discovery.
func manifestClients(t *testing.T, c *controlplane.Cluster, manifest string) ([]*unstructured.Unstructured, dynamic.Interface, meta.RESTMapper) {
	t.Helper()
	objs, err := helm.Decode(manifest)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.AdminConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return objs, dyn, restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
}
