package claimstatus

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestDesiredAndDiffers(t *testing.T) {
	s := New(nil, "n1", Options{Driver: "gpu.nvidia.com", UUIDAttribute: "uuid"})
	str := func(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(v)} }
	slice := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To("n1"),
		Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
		Devices: []resourceapi.Device{
			{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": str("GPU-a")}},
			{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": str("GPU-b")}},
			{Name: "gpu-0-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"parentUUID": str("GPU-a")}},
			{Name: "gpu-1-mig-1g10gb-19-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"parentUUID": str("GPU-b")}},
		}}}
	catalog, problems := dra.NewCatalog([]*resourceapi.ResourceSlice{slice}, "n1", "gpu.nvidia.com", dra.DefaultAttributes())
	if len(problems) > 0 {
		t.Fatalf("problems: %v", problems)
	}
	assigned, _ := catalog.Assign(health.Snapshot{Devices: []health.DeviceStatus{
		{Device: health.Device{UUID: "GPU-a"}, Health: health.Unhealthy, Evict: true,
			Conditions: []health.Condition{{Type: health.ConditionXID, Severity: health.Unhealthy, Reason: "XID79", Message: "XID 79: GPU has fallen off the bus"}}},
		{Device: health.Device{UUID: "GPU-b"}, Health: health.Healthy},
	}})
	claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0-mig-1g10gb-19-0"},
			{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1-mig-1g10gb-19-0"},
			{Driver: "gpu.nvidia.com", Pool: "other-node", Device: "gpu-0"},
			{Driver: "other.driver", Pool: "n1", Device: "gpu-0"},
		}},
	}}}
	want := s.desired(claim, assigned)
	if len(want) != 2 {
		t.Fatalf("desired = %+v, want conditions for the sick GPU and its MIG partition only", want)
	}
	for _, dev := range []string{"gpu-0", "gpu-0-mig-1g10gb-19-0"} {
		c := want[dra.DeviceID{Pool: "n1", Device: dev}]
		if c.Type != ConditionType || c.Status != metav1.ConditionFalse || c.Reason != ReasonUnhealthy ||
			!strings.Contains(c.Message, "XID79") || !strings.Contains(c.Message, "eviction requested") {
			t.Errorf("condition of %s = %+v", dev, c)
		}
	}
	if !s.differs(claim, catalog, want) {
		t.Error("a claim without the condition does not differ from one with it")
	}
	for key, c := range want {
		claim.Status.Devices = append(claim.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: "gpu.nvidia.com", Pool: key.Pool, Device: key.Device, Conditions: []metav1.Condition{c}})
	}
	if s.differs(claim, catalog, want) {
		t.Error("the claim already carries the conditions, yet differs")
	}
	if !s.differs(claim, catalog, map[dra.DeviceID]metav1.Condition{}) {
		t.Error("recovery (no condition wanted) does not differ from a claim that has one")
	}
}

func TestSyncBeforeStartIsAnError(t *testing.T) {
	if _, err := New(nil, "n1", Options{}).Sync(t.Context(), health.Snapshot{}); err == nil {
		t.Fatal("Sync before Start succeeded")
	}
}

// TestClaimsAreReadOnlyWhenThereIsSomethingToCheck: claims are found through the node's pods
// and read only once after start, while a GPU is sick, or while they carry our condition.
func TestClaimsAreReadOnlyWhenThereIsSomethingToCheck(t *testing.T) {
	ctx := t.Context()
	gpuSlice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "n1-gpus"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: ptr.To("n1"), Pool: resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{
				{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-a")}}},
				{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-b")}}},
			}},
	}
	pod := func(name, node, claim string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:       corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}},
		}
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c1"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"}},
		}}}}
	other := claim.DeepCopy()
	other.Name = "c2"
	client := fake.NewClientset(gpuSlice, pod("p1", "n1", "c1"), pod("p2", "n2", "c2"), claim, other)
	var gets []string
	client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		gets = append(gets, a.(k8stesting.GetAction).GetName())
		return false, nil, nil
	})
	s := New(adapt.Clientset(client), "n1", Options{Driver: "gpu.nvidia.com", UUIDAttribute: "uuid"})
	if err := s.Start(ctx, func() {}); err != nil {
		t.Fatal(err)
	}
	snap := func(bHealth health.Severity) health.Snapshot {
		b := health.DeviceStatus{Device: health.Device{UUID: "GPU-b", Index: 1}, Health: bHealth}
		if bHealth != health.Healthy {
			b.Conditions = []health.Condition{{Type: health.ConditionXID, Severity: bHealth, Reason: "XID48"}}
		}
		return health.Snapshot{Devices: []health.DeviceStatus{{Device: health.Device{UUID: "GPU-a"}, Health: health.Healthy}, b}}
	}
	for _, step := range []struct {
		name     string
		snap     health.Snapshot
		wantGets int
	}{
		{"first sync checks every claim on the node", snap(health.Healthy), 1},
		{"all healthy, nothing marked: no reads", snap(health.Healthy), 0},
		{"a GPU is sick: the node's claims are checked", snap(health.Unhealthy), 1},
		{"recovered, nothing was written: no reads", snap(health.Healthy), 0},
	} {
		gets = nil
		if n, err := s.Sync(ctx, step.snap); err != nil || n != 0 {
			t.Fatalf("%s: Sync = %d, %v; want no writes (the claim holds the healthy GPU)", step.name, n, err)
		}
		if len(gets) != step.wantGets {
			t.Errorf("%s: read claims %v, want %d reads", step.name, gets, step.wantGets)
		}
	}
}
