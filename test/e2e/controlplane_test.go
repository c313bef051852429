//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// pollTimeout bounds every wait for a controller to act. Generous for a loaded 2-core CI machine;
// the actions themselves take well under a second.
const pollTimeout = 60 * time.Second

const (
	nodeName      = "gpu-node-a"
	uuidTainted   = "GPU-11111111-1111-1111-1111-111111111111"
	uuidHealthy   = "GPU-22222222-2222-2222-2222-222222222222"
	taintKeySlice = "gpuhealth.dev/xid"
	taintKeyRule  = "gpuhealth.dev/unhealthy"
)

// TestControlPlaneSelfTest proves the harness gives a control plane that behaves like a real
// cluster for DRA device taints: the objects persist every field, the real scheduler avoids a
// tainted device, and the real controller-manager evicts a pod whose device gets a NoExecute
// taint.
func TestControlPlaneSelfTest(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()

	steps := []struct {
		name string
		run  func(*testing.T, context.Context, *controlplane.Cluster)
	}{
		{"binaries and server report the pinned version", checkVersions},
		{"fake node is Ready and schedulable", checkReadyNode},
		{"device taints in slices and rules persist", checkDeviceTaintsPersist},
		{"scheduler binds a pod to the untainted device", checkSchedulingAvoidsTaintedDevice},
		{"ResourceClaim device status persists", checkClaimDeviceStatusPersists},
		{"controller-manager evicts the pod on a NoExecute taint", checkNoExecuteEvicts},
	}
	for _, step := range steps {
		// Each step builds on the previous one; stop at the first failure.
		if !t.Run(step.name, func(t *testing.T) { step.run(t, ctx, c) }) {
			return
		}
	}
}

func checkVersions(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	for _, bin := range []string{controlplane.BinAPIServer, controlplane.BinScheduler, controlplane.BinControllerManager} {
		out, err := exec.CommandContext(ctx, filepath.Join(c.BinDir(), bin), "--version").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --version: %v\n%s", bin, err, out)
		}
		if got, want := strings.TrimSpace(string(out)), "Kubernetes "+controlplane.KubernetesVersion; got != want {
			t.Errorf("%s --version = %q, want %q", bin, got, want)
		}
	}
	info, err := c.Admin().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if info.GitVersion != controlplane.KubernetesVersion {
		t.Errorf("server version = %s, want %s", info.GitVersion, controlplane.KubernetesVersion)
	}
}

func checkReadyNode(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	if _, err := c.CreateReadyNode(ctx, nodeName, map[string]string{"nvidia.com/gpu.present": "true"}); err != nil {
		t.Fatal(err)
	}
	node, err := c.Admin().CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read node back: %v", err)
	}
	ready := slices.ContainsFunc(node.Status.Conditions, func(cond corev1.NodeCondition) bool {
		return cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
	})
	if !ready {
		t.Errorf("node conditions = %+v, want Ready=True", node.Status.Conditions)
	}
	if len(node.Spec.Taints) != 0 {
		t.Errorf("node taints = %+v, want none", node.Spec.Taints)
	}
	if got := node.Status.Allocatable.Pods().Value(); got == 0 {
		t.Errorf("allocatable pods = %d, want > 0", got)
	}
	if node.Labels["nvidia.com/gpu.present"] != "true" {
		t.Errorf("node labels = %v, want nvidia.com/gpu.present=true", node.Labels)
	}
}

func checkDeviceTaintsPersist(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	cs := c.Admin()
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass: %v", err)
	}

	slice := controlplane.GPUResourceSlice(nodeName, uuidTainted, uuidHealthy)
	slice.Spec.Devices[0].Taints = []resourcev1.DeviceTaint{{Key: taintKeySlice, Value: "79", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	if _, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceSlice: %v", err)
	}
	got, err := cs.ResourceV1().ResourceSlices().Get(ctx, slice.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read ResourceSlice back: %v", err)
	}
	if len(got.Spec.Devices) != 2 {
		t.Fatalf("slice has %d devices, want 2", len(got.Spec.Devices))
	}
	tainted, healthy := got.Spec.Devices[0], got.Spec.Devices[1]
	if tainted.Name != "gpu-0" || healthy.Name != "gpu-1" {
		t.Errorf("device names = %s, %s, want gpu-0, gpu-1", tainted.Name, healthy.Name)
	}
	if uuid := ptr.Deref(tainted.Attributes["uuid"].StringValue, ""); uuid != uuidTainted {
		t.Errorf("gpu-0 uuid = %q, want %q", uuid, uuidTainted)
	}
	if idx := ptr.Deref(healthy.Attributes["index"].IntValue, -1); idx != 1 {
		t.Errorf("gpu-1 index = %d, want 1", idx)
	}
	if mem := healthy.Capacity["memory"].Value; mem.String() != "80Gi" {
		t.Errorf("gpu-1 memory = %s, want 80Gi", mem.String())
	}
	if len(tainted.Taints) != 1 {
		t.Fatalf("gpu-0 taints = %+v, want one (dropped by a feature gate?)", tainted.Taints)
	}
	if tt := tainted.Taints[0]; tt.Key != taintKeySlice || tt.Value != "79" || tt.Effect != resourcev1.DeviceTaintEffectNoSchedule || tt.TimeAdded == nil {
		t.Errorf("gpu-0 taint = %+v, want %s=79:NoSchedule with timeAdded set by the server", tt, taintKeySlice)
	}
	if len(healthy.Taints) != 0 {
		t.Errorf("gpu-1 taints = %+v, want none", healthy.Taints)
	}

	rule := controlplane.GPUDeviceTaintRule("gpu-node-a-gpu-0-unhealthy", nodeName, "gpu-0",
		resourcev1.DeviceTaint{Key: taintKeyRule, Value: uuidTainted, Effect: resourcev1.DeviceTaintEffectNoSchedule})
	before := time.Now().Add(-time.Second).Truncate(time.Second)
	if _, err := cs.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceTaintRule: %v", err)
	}
	gotRule, err := cs.ResourceV1().DeviceTaintRules().Get(ctx, rule.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read DeviceTaintRule back: %v", err)
	}
	sel := gotRule.Spec.DeviceSelector
	if sel == nil || ptr.Deref(sel.Driver, "") != controlplane.GPUDriver || ptr.Deref(sel.Pool, "") != nodeName || ptr.Deref(sel.Device, "") != "gpu-0" {
		t.Errorf("rule selector = %+v, want driver=%s pool=%s device=gpu-0", sel, controlplane.GPUDriver, nodeName)
	}
	taint := gotRule.Spec.Taint
	if taint.Key != taintKeyRule || taint.Value != uuidTainted || taint.Effect != resourcev1.DeviceTaintEffectNoSchedule {
		t.Errorf("rule taint = %+v, want %s=%s:NoSchedule", taint, taintKeyRule, uuidTainted)
	}
	if taint.TimeAdded == nil || taint.TimeAdded.Time.Before(before) {
		t.Errorf("rule taint timeAdded = %v, want set by the server at creation (after %v)", taint.TimeAdded, before)
	}
}

func checkSchedulingAvoidsTaintedDevice(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	cs := c.Admin()
	ns := "selftest"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	c.StartKubeletT(t, nodeName)
	if _, err := cs.ResourceV1().ResourceClaims(ns).Create(ctx, controlplane.GPUClaim(ns, "gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaim: %v", err)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, controlplane.PodWithClaims(ns, "trainer", "gpu"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = cs.CoreV1().Pods(ns).Get(ctx, "trainer", metav1.GetOptions{})
		return err == nil && pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodRunning, err
	})
	if err != nil {
		t.Fatalf("wait for the pod to be bound and (fake) running: %v; pod status %+v", err, podStatus(pod))
	}
	if pod.Spec.NodeName != nodeName {
		t.Errorf("pod bound to %q, want %q", pod.Spec.NodeName, nodeName)
	}

	claim, err := cs.ResourceV1().ResourceClaims(ns).Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read claim: %v", err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim allocation = %+v, want one device", claim.Status.Allocation)
	}
	res := claim.Status.Allocation.Devices.Results[0]
	if res.Driver != controlplane.GPUDriver || res.Pool != nodeName || res.Device != "gpu-1" || res.Request != controlplane.GPUClaimRequest {
		t.Errorf("allocated %s/%s/%s for request %q, want %s/%s/gpu-1 for %q (the untainted device)",
			res.Driver, res.Pool, res.Device, res.Request, controlplane.GPUDriver, nodeName, controlplane.GPUClaimRequest)
	}
	reserved := slices.ContainsFunc(claim.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool {
		return r.Resource == "pods" && r.Name == "trainer" && r.UID == pod.UID
	})
	if !reserved {
		t.Errorf("claim reservedFor = %+v, want the pod", claim.Status.ReservedFor)
	}
}

func checkClaimDeviceStatusPersists(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	claims := c.Admin().ResourceV1().ResourceClaims("selftest")
	claim, err := claims.Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read claim: %v", err)
	}
	claim.Status.Devices = []resourcev1.AllocatedDeviceStatus{{
		Driver: controlplane.GPUDriver,
		Pool:   nodeName,
		Device: "gpu-1",
		Conditions: []metav1.Condition{{
			Type: "Healthy", Status: metav1.ConditionTrue, Reason: "NoFaults",
			Message: "no XID errors", LastTransitionTime: metav1.Now(),
		}},
	}}
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("write claim device status: %v", err)
	}
	got, err := claims.Get(ctx, "gpu", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read claim back: %v", err)
	}
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Device != "gpu-1" ||
		len(got.Status.Devices[0].Conditions) != 1 || got.Status.Devices[0].Conditions[0].Reason != "NoFaults" {
		t.Errorf("claim device status = %+v, want gpu-1 with condition Healthy/NoFaults (dropped by a feature gate?)", got.Status.Devices)
	}
}

func checkNoExecuteEvicts(t *testing.T, ctx context.Context, c *controlplane.Cluster) {
	cs := c.Admin()
	ns := "selftest"
	c.StartKubeletT(t, nodeName) // completes the graceful deletion, as the kubelet would
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "trainer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("read pod: %v", err)
	}

	rule := controlplane.GPUDeviceTaintRule("gpu-node-a-gpu-1-evict", nodeName, "gpu-1",
		resourcev1.DeviceTaint{Key: taintKeyRule, Value: uuidHealthy, Effect: resourcev1.DeviceTaintEffectNoExecute})
	if _, err := cs.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create NoExecute DeviceTaintRule: %v", err)
	}

	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		got, err := cs.CoreV1().Pods(ns).Get(ctx, "trainer", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && got.UID != pod.UID, err
	})
	if err != nil {
		t.Fatalf("wait for the pod to be evicted and deleted: %v", err)
	}

	// The eviction must have come from the device-taint eviction controller.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		events, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(events.Items, func(e corev1.Event) bool {
			return e.Reason == "DeviceTaintManagerEviction" && e.InvolvedObject.UID == pod.UID
		}), nil
	})
	if err != nil {
		t.Fatalf("wait for the DeviceTaintManagerEviction event: %v", err)
	}

	// With its only consumer gone, the resourceclaim controller releases the claim.
	var claim *resourcev1.ResourceClaim
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		claim, err = cs.ResourceV1().ResourceClaims(ns).Get(ctx, "gpu", metav1.GetOptions{})
		return err == nil && len(claim.Status.ReservedFor) == 0 && claim.Status.Allocation == nil, err
	})
	if err != nil {
		t.Fatalf("wait for the claim to be released: %v; status %+v", err, claim.Status)
	}
}

// podStatus is a short description of a pod for failure messages.
func podStatus(pod *corev1.Pod) string {
	if pod == nil {
		return "<none>"
	}
	var conds []string
	for _, c := range pod.Status.Conditions {
		conds = append(conds, string(c.Type)+"="+string(c.Status)+" "+c.Reason+" "+c.Message)
	}
	return "node=" + pod.Spec.NodeName + " phase=" + string(pod.Status.Phase) + " conditions=[" + strings.Join(conds, "; ") + "]"
}
