package fleet

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

const gpuDriver = "gpu.nvidia.com"

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

// claimSlice is a slice of pool (on the node of that name) and generation; devices are name →
// attributes.
func claimSlice(pool string, gen int64, devices map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.ResourceSlice {
	node := pool
	s := resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: pool + "-slice"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: gpuDriver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: 1},
	}}
	for name, attrs := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: name, Attributes: attrs})
	}
	return s
}

// allocated is a claim of namespace default allocated results, each driver/pool/device.
func allocated(name string, results ...[3]string) resourceapi.ResourceClaim {
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if results == nil {
		return c
	}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, r := range results {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: r[0], Pool: r[1], Device: r[2]})
	}
	return c
}

// claimPod is a running pod of job on node n1 whose status names claims.
func claimPod(name, job string, claims ...string) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "batch/v1", Kind: "Job", Name: job, Controller: new(true)},
		}},
		Spec:   corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, c := range claims {
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: "gpu", ResourceClaimName: &c})
	}
	return p
}

func claimFixtures() ([]resourceapi.ResourceClaim, []resourceapi.ResourceSlice) {
	slices := []resourceapi.ResourceSlice{
		claimSlice("n1", 2, map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"gpu-0":       {"uuid": str("GPU-a")},
			"gpu-1":       {"uuid": str("GPU-b"), "productName": str("H100")},
			"gpu-1-mig-0": {"gpu.nvidia.com/uuid": str("MIG-x"), "parentUUID": str("GPU-b")},
		}),
		// The pool's older generation, on its way out: not read.
		func() resourceapi.ResourceSlice {
			s := claimSlice("n1", 1, map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"gpu-0": {"uuid": str("GPU-old")}})
			s.Name = "n1-old"
			return s
		}(),
		// Another pool with a device of the same name.
		claimSlice("n2", 1, map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"gpu-0": {"uuid": str("GPU-c")}}),
	}
	claims := []resourceapi.ResourceClaim{
		allocated("two", [3]string{gpuDriver, "n1", "gpu-0"}, [3]string{gpuDriver, "n1", "gpu-1"}),
		allocated("other-driver", [3]string{"nic.example.com", "n1", "gpu-0"}),
		allocated("pending"),
		allocated("mig", [3]string{gpuDriver, "n1", "gpu-1-mig-0"}),
		allocated("shared", [3]string{gpuDriver, "n2", "gpu-0"}),
	}
	return claims, slices
}

func TestClaimCards(t *testing.T) {
	claims, slices := claimFixtures()
	pods := []corev1.Pod{
		claimPod("two", "job-a", "two"),
		claimPod("other-driver", "job-a", "other-driver"),
		claimPod("pending", "job-a", "pending"),
		claimPod("mig", "job-b", "mig"),
		claimPod("shared-1", "job-c", "shared"),
		claimPod("shared-2", "job-c", "shared"),
		claimPod("missing", "job-c", "no-such-claim"),
	}
	got := ClaimCards(pods, claims, slices, gpuDriver, dra.DefaultAttributes())
	want := map[string][]string{
		"default/two":      {"GPU-a", "GPU-b"},
		"default/mig":      {"GPU-b"},
		"default/shared-1": {"GPU-c"},
		"default/shared-2": {"GPU-c"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ClaimCards = %v, want %v", got, want)
	}
}

func TestSliceGPUs(t *testing.T) {
	_, slices := claimFixtures()
	ptrs := []*resourceapi.ResourceSlice{&slices[0], &slices[1], &slices[2]}
	got := SliceGPUs(ptrs, gpuDriver, dra.DefaultAttributes())
	want := map[dra.DeviceID]string{
		{Pool: "n1", Device: "gpu-0"}: "GPU-a", {Pool: "n1", Device: "gpu-1"}: "GPU-b", {Pool: "n1", Device: "gpu-1-mig-0"}: "GPU-b",
		{Pool: "n2", Device: "gpu-0"}: "GPU-c",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SliceGPUs = %v, want %v", got, want)
	}
	if got := SliceGPUs(ptrs, "other.example.com", dra.DefaultAttributes()); len(got) != 0 {
		t.Errorf("SliceGPUs of another driver = %v, want none", got)
	}
}

func TestCollectHeldCountsClaims(t *testing.T) {
	claims, slices := claimFixtures()
	nodes := []corev1.Node{node(t, "n1", nil, map[string]gpuhealthv1.GPUSummary{
		"GPU-a": {Index: 0, Health: "Healthy"}, "GPU-b": {Index: 1, Health: "Healthy"}, "GPU-z": {Index: 2, Health: "Healthy"},
	})}
	annotated := claimPod("annotated", "job-a", "mig")
	annotated.Annotations = map[string]string{gpuhealthv1.PodGPUUUIDKey: "GPU-z"} // the card it names wins
	pods := []corev1.Pod{claimPod("two", "job-a", "two"), claimPod("mig", "job-b", "mig"), claimPod("pending", "job-c", "pending"), annotated}
	got := CollectHeld(nodes, pods, ClaimCards(pods, claims, slices, gpuDriver, dra.DefaultAttributes()), nil).Fleet.Workloads
	want := map[string][]string{"job/default/job-a": {"GPU-a", "GPU-b", "GPU-z"}, "job/default/job-b": {"GPU-b"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("workloads = %v, want %v", got, want)
	}

	// The same through what a cache keeps: WorkloadPodOf, ClaimDevices, SliceGPUs, HoldClaims.
	byClaim := map[string][]dra.DeviceID{}
	for i := range claims {
		byClaim["default/"+claims[i].Name] = ClaimDevices(&claims[i], gpuDriver)
	}
	var wps []WorkloadPod
	for i := range pods {
		if wp, ok := WorkloadPodOf(&pods[i]); ok {
			wps = append(wps, wp)
		}
	}
	devices := SliceGPUs([]*resourceapi.ResourceSlice{&slices[0], &slices[1], &slices[2]}, gpuDriver, dra.DefaultAttributes())
	if got := CollectFrom([]*corev1.Node{&nodes[0]}, HoldClaims(wps, byClaim, devices), nil).Fleet.Workloads; !reflect.DeepEqual(got, want) {
		t.Errorf("workloads from the cache's parts = %v, want %v", got, want)
	}
}
