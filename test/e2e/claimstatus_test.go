//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/claimstatus"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// ourCondition returns the gpuhealth condition of device in the claim's status, if any.
func ourCondition(claim *resourcev1.ResourceClaim, device string) (metav1.Condition, bool) {
	for _, ds := range claim.Status.Devices {
		if ds.Device != device {
			continue
		}
		for _, c := range ds.Conditions {
			if c.Type == claimstatus.ConditionType {
				return c, true
			}
		}
	}
	return metav1.Condition{}, false
}

// TestClaimStatusReportsSickGPUs runs the agent with a token bound to its node, as a DaemonSet
// pod has, so that the API server's per-driver check (resourceclaims/driver, associated-node)
// lets it write status.devices: a claim holding a GPU that turns Unhealthy gets a condition for
// that device, a claim on a healthy GPU gets none, and the condition goes away on recovery.
func TestClaimStatusReportsSickGPUs(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const ns, node = "claims", "claim-node"
	uuids := gpuNode(t, c, node, 8)
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	podWithClaim(t, c, pinnedClaim(ns, "on-sick", uuids[2], ""), node)
	podWithClaim(t, c, pinnedClaim(ns, "on-healthy", uuids[4], ""), node)
	waitAllocated(t, c, ns, "on-sick", controlplane.GPUDeviceName(2))
	waitAllocated(t, c, ns, "on-healthy", controlplane.GPUDeviceName(4))

	startAgent(t, agentSetup{node: node, gpus: 8, kubeconfig: agentKubeconfigOnNode(t, c, node), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 2s, gpu: 2, xid: 48}\n  - {at: 10s, gpu: 2, reset: true}\n"})

	eventually(t, "the claim on the sick GPU carries the condition", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-sick", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		cond, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return ok && cond.Status == metav1.ConditionFalse && cond.Reason == claimstatus.ReasonUnhealthy &&
			cond.Message != "" && !cond.LastTransitionTime.IsZero(), fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
	healthy, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-healthy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(healthy.Status.Devices) != 0 {
		t.Errorf("the claim on a healthy GPU got device status: %+v", healthy.Status.Devices)
	}
	eventually(t, "the condition goes away after the GPU reset", func(ctx context.Context) (bool, string, error) {
		claim, err := c.Admin().ResourceV1().ResourceClaims(ns).Get(ctx, "on-sick", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		_, ok := ourCondition(claim, controlplane.GPUDeviceName(2))
		return !ok, fmt.Sprintf("%+v", claim.Status.Devices), nil
	})
}
