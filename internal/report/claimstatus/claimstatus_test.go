package claimstatus

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestDesiredAndDiffers(t *testing.T) {
	s := New(nil, "n1", Options{Driver: "gpu.nvidia.com", UUIDAttribute: "uuid"})
	uuidOf := map[deviceKey]string{{Pool: "n1", Name: "gpu-0"}: "gpu-a", {Pool: "n1", Name: "gpu-1"}: "gpu-b"}
	byUUID := map[string]health.DeviceStatus{
		"gpu-a": {Device: health.Device{UUID: "GPU-a"}, Health: health.Unhealthy, Evict: true,
			Conditions: []health.Condition{{Type: health.ConditionXID, Severity: health.Unhealthy, Reason: "XID79", Message: "XID 79: GPU has fallen off the bus"}}},
		"gpu-b": {Device: health.Device{UUID: "GPU-b"}, Health: health.Healthy},
	}
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1"},
			{Driver: "gpu.nvidia.com", Pool: "other-node", Device: "gpu-0"},
			{Driver: "other.driver", Pool: "n1", Device: "gpu-0"},
		}},
	}}}
	want := s.desired(claim, uuidOf, byUUID)
	if len(want) != 1 {
		t.Fatalf("desired = %+v, want one condition for the sick GPU only", want)
	}
	c := want[deviceKey{Pool: "n1", Name: "gpu-0"}]
	if c.Type != ConditionType || c.Status != metav1.ConditionFalse || c.Reason != ReasonUnhealthy ||
		!strings.Contains(c.Message, "XID79") || !strings.Contains(c.Message, "eviction requested") {
		t.Errorf("condition = %+v", c)
	}
	if !s.differs(claim, uuidOf, want) {
		t.Error("a claim without the condition does not differ from one with it")
	}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0", Conditions: []metav1.Condition{c}}}
	if s.differs(claim, uuidOf, want) {
		t.Error("the claim already carries the condition, yet differs")
	}
	if !s.differs(claim, uuidOf, map[deviceKey]metav1.Condition{}) {
		t.Error("recovery (no condition wanted) does not differ from a claim that has one")
	}
}

func TestSyncBeforeStartIsAnError(t *testing.T) {
	if _, err := New(nil, "n1", Options{}).Sync(t.Context(), health.Snapshot{}); err == nil {
		t.Fatal("Sync before Start succeeded")
	}
}
