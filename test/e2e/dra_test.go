//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// pinnedClaim is a claim for the one GPU with uuid (a CEL selector on the driver's uuid
// attribute), optionally tolerating taints of key. The toleration names the NoExecute effect:
// kube-controller-manager's device-taint eviction controller only counts tolerations that do
// (one without an effect lets the scheduler allocate, then the pod is evicted anyway).
func pinnedClaim(ns, name, uuid, tolerateKey string) *resourcev1.ResourceClaim {
	claim := controlplane.GPUClaim(ns, name)
	req := claim.Spec.Devices.Requests[0].Exactly
	req.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
		Expression: fmt.Sprintf(`device.attributes[%q].uuid == %q`, controlplane.GPUDriver, uuid),
	}}}
	if tolerateKey != "" {
		req.Tolerations = []resourcev1.DeviceToleration{{Key: tolerateKey, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoExecute}}
	}
	return claim
}

// podWithClaim creates a claim and a pod using it, pinned to node.
func podWithClaim(t *testing.T, c *controlplane.Cluster, claim *resourcev1.ResourceClaim, node string) *corev1.Pod {
	t.Helper()
	ctx := t.Context()
	if _, err := c.Admin().ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := controlplane.PodWithClaims(claim.Namespace, claim.Name, claim.Name)
	pod.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	created, err := c.Admin().CoreV1().Pods(claim.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// allocatedDevice returns the device a claim got, or "" while it has none.
func allocatedDevice(ctx context.Context, c *controlplane.Cluster, ns, name string) (string, error) {
	claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) == 0 {
		return "", err
	}
	return claim.Status.Allocation.Devices.Results[0].Device, nil
}

func waitAllocated(t *testing.T, c *controlplane.Cluster, ns, name, wantDevice string) {
	t.Helper()
	eventually(t, "claim "+name+" allocated "+wantDevice, func(ctx context.Context) (bool, string, error) {
		dev, err := allocatedDevice(ctx, c, ns, name)
		if err != nil {
			return false, "", err
		}
		pod, err := c.Admin().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return dev == wantDevice && pod.Spec.NodeName != "", fmt.Sprintf("device=%q node=%q", dev, pod.Spec.NodeName), nil
	})
}

// waitUnschedulable waits until the scheduler has declared the pod unschedulable.
func waitUnschedulable(t *testing.T, c *controlplane.Cluster, ns, name string) {
	t.Helper()
	eventually(t, "pod "+name+" unschedulable", func(ctx context.Context) (bool, string, error) {
		pod, err := c.Admin().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return pod.Spec.NodeName == "", cond.Message, nil
			}
		}
		return false, "no PodScheduled=False yet", nil
	})
}

// TestDRAPathAvoidsSickGPUs proves the DRA path end to end with the stock kube-scheduler,
// kube-controller-manager and kubelet: once the agent (sim backend) marks a GPU Unhealthy, no new claim gets
// it; with NoExecute enabled, the pod already holding it is evicted by the device-taint eviction
// controller; a Degraded GPU (effect None) and a tolerated taint still allocate; after recovery
// the GPU is allocatable again.
func TestDRAPathAvoidsSickGPUs(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{NodeNetwork: true})
	ctx := t.Context()
	const ns, sick, spare = "dra", "dra-node-a", "dra-node-b"
	// The sick node is a real kubelet (with a DRA plugin): the pods there really run, and an
	// evicted one really goes away. The spare node is a plain Node object.
	uuids, _ := realGPUNode(t, c, sick, 8)
	gpuNode(t, c, spare, 8)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	// A job holds GPU 3 before anything goes wrong.
	victim := podWithClaim(t, c, pinnedClaim(ns, "victim", uuids[3], ""), sick)
	waitAllocated(t, c, ns, "victim", controlplane.GPUDeviceName(3))

	// GPU 3 falls off the bus (XID 79 asks for eviction), GPU 5 runs hot (Degraded); much later
	// the node reboots and both recover.
	startAgent(t, agentSetup{node: sick, gpus: 8, kubeconfig: agentKubeconfigOnNode(t, c, sick), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		noExecute: true, scenario: `events:
  - {at: 1s, gpu: 3, xid: 79}
  - {at: 1s, gpu: 5, temperatureC: 91}
  - {at: 50s, reboot: true}
`})
	eventually(t, "rules for the sick and the hot GPU", func(ctx context.Context) (bool, string, error) {
		rs, err := rules(ctx, c, sick)
		if err != nil {
			return false, "", err
		}
		r3, r5 := rs[devicetaint.RuleName(sick, uuids[3])], rs[devicetaint.RuleName(sick, uuids[5])]
		return r3.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNoExecute && r5.Spec.Taint.Effect == resourcev1.DeviceTaintEffectNone,
			fmt.Sprint(ruleNames(rs)), nil
	})

	t.Run("the pod holding the sick GPU is evicted", func(t *testing.T) {
		eventually(t, "victim evicted", func(ctx context.Context) (bool, string, error) {
			got, err := c.Admin().CoreV1().Pods(ns).Get(ctx, victim.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "deleted", nil
			}
			return false, fmt.Sprintf("still there: %v", got.DeletionTimestamp), err
		})
		eventually(t, "the eviction came from the device taint eviction controller", func(ctx context.Context) (bool, string, error) {
			evs, err := c.Admin().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, "", err
			}
			return slices.ContainsFunc(evs.Items, func(e corev1.Event) bool {
				return e.Reason == "DeviceTaintManagerEviction" && e.InvolvedObject.UID == victim.UID
			}), fmt.Sprintf("%d events", len(evs.Items)), nil
		})
	})

	t.Run("no new claim gets the sick GPU", func(t *testing.T) {
		podWithClaim(t, c, pinnedClaim(ns, "wants-sick", uuids[3], ""), sick)
		waitUnschedulable(t, c, ns, "wants-sick")
		// Any GPU of the node: seven are left and all seven are used; never GPU 3.
		for i := range 7 {
			podWithClaim(t, c, controlplane.GPUClaim(ns, fmt.Sprintf("any-%d", i)), sick)
		}
		eventually(t, "seven claims allocated on the healthy and degraded GPUs", func(ctx context.Context) (bool, string, error) {
			var got []string
			for i := range 7 {
				dev, err := allocatedDevice(ctx, c, ns, fmt.Sprintf("any-%d", i))
				if err != nil {
					return false, "", err
				}
				if dev == controlplane.GPUDeviceName(3) {
					return false, "", fmt.Errorf("claim any-%d was allocated the sick GPU", i)
				}
				if dev != "" {
					got = append(got, dev)
				}
			}
			return len(got) == 7, fmt.Sprint(got), nil
		})
		if dev, err := allocatedDevice(ctx, c, ns, "wants-sick"); err != nil || dev != "" {
			t.Errorf("wants-sick: device %q, err %v; want none", dev, err)
		}
	})

	t.Run("a claim tolerating the taint still gets the GPU", func(t *testing.T) {
		podWithClaim(t, c, pinnedClaim(ns, "tolerant", uuids[3], "gpuhealth.dev/xid"), sick)
		waitAllocated(t, c, ns, "tolerant", controlplane.GPUDeviceName(3))
		// Make room again for the recovery step.
		if err := c.Admin().CoreV1().Pods(ns).Delete(ctx, "tolerant", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("after recovery the GPU is allocatable again", func(t *testing.T) {
		eventually(t, "rules removed after the reboot", func(ctx context.Context) (bool, string, error) {
			rs, err := rules(ctx, c, sick)
			return err == nil && len(rs) == 0, fmt.Sprint(ruleNames(rs)), err
		})
		waitAllocated(t, c, ns, "wants-sick", controlplane.GPUDeviceName(3))
	})
}
