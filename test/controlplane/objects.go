package controlplane

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// GPUDriver is the DRA driver name of NVIDIA's GPU driver; GPU ResourceSlices, the GPU
// DeviceClass and DeviceTaintRules built here use it.
const GPUDriver = "gpu.nvidia.com"

// GPUDeviceClassName is the name of the DeviceClass GPUDeviceClass returns (NVIDIA's chart
// installs a class of the same name).
const GPUDeviceClassName = "gpu.nvidia.com"

// GPUClaimRequest is the request name in claims built by GPUClaim.
const GPUClaimRequest = "gpu"

// Defaults of the fake GPUs: an H100 SXM, the most common data-centre part.
const (
	fakeGPUProduct     = "NVIDIA H100 80GB HBM3"
	fakeGPUArch        = "Hopper"
	fakeGPUMemoryBytes = 80 << 30
)

// GPUDeviceName is the name GPUResourceSlice gives the GPU with this index. NVIDIA's driver
// names a GPU by its minor number instead (NVIDIAGPUDeviceName); the two agree where, as in
// GPUResourceSlice, minor and index are the same.
func GPUDeviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// GPUResourceSlice returns a ResourceSlice shaped like the one NVIDIA's DRA driver published for
// node before 2025: driver gpu.nvidia.com, pool named after the node, one device per UUID named
// gpu-0..gpu-N by index, with uuid, index, minor (equal to the index), productName, type=gpu,
// brand, architecture, versions and memory capacity. Many tests rely on that simple shape; for
// the driver's current slices (devices named by minor, no index or minor attribute, MIG, DynamicMIG
// and VFIO devices) use NVIDIAResourceSlice, NVIDIAPassthroughResourceSlice and
// NVIDIADynamicMIGResourceSlices. Attribute names are unqualified, so CEL sees them
// as device.attributes["gpu.nvidia.com"].uuid and so on. Set Devices[i].Taints to taint devices
// the way a driver would.
func GPUResourceSlice(node string, uuids ...string) *resourcev1.ResourceSlice {
	devices := make([]resourcev1.Device, 0, len(uuids))
	for i, uuid := range uuids {
		devices = append(devices, resourcev1.Device{
			Name: GPUDeviceName(i),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"type":                  {StringValue: ptr.To("gpu")},
				"uuid":                  {StringValue: ptr.To(uuid)},
				"index":                 {IntValue: ptr.To(int64(i))},
				"minor":                 {IntValue: ptr.To(int64(i))},
				"productName":           {StringValue: ptr.To(fakeGPUProduct)},
				"brand":                 {StringValue: ptr.To("Nvidia")},
				"architecture":          {StringValue: ptr.To(fakeGPUArch)},
				"cudaComputeCapability": {VersionValue: ptr.To("9.0.0")},
				"driverVersion":         {VersionValue: ptr.To("580.95.5")},
				"cudaDriverVersion":     {VersionValue: ptr.To("13.0.0")},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: *resource.NewQuantity(fakeGPUMemoryBytes, resource.BinarySI)},
			},
		})
	}
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + GPUDriver},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   GPUDriver,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
			Devices:  devices,
		},
	}
}

// GPUDeviceClass returns the DeviceClass selecting every device of the gpu.nvidia.com driver.
func GPUDeviceClass() *resourcev1.DeviceClass {
	return &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: GPUDeviceClassName},
		Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{
				CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", GPUDriver)},
			}},
		},
	}
}

// GPUClaim returns a ResourceClaim for one device of GPUDeviceClassName, in request
// GPUClaimRequest. Add tolerations to Spec.Devices.Requests[0].Exactly.Tolerations as needed.
func GPUClaim(namespace, name string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: resourcev1.ResourceClaimSpec{
			Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{
					Name: GPUClaimRequest,
					Exactly: &resourcev1.ExactDeviceRequest{
						DeviceClassName: GPUDeviceClassName,
						AllocationMode:  resourcev1.DeviceAllocationModeExactCount,
						Count:           1,
					},
				}},
			},
		},
	}
}

// PodWithClaims returns a pod with one container that uses each named ResourceClaim (the pod's
// claim reference has the claim's name). The image is never pulled: there is no kubelet.
func PodWithClaims(namespace, name string, claimNames ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "pause:3.10"}},
		},
	}
	for _, claim := range claimNames {
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, corev1.PodResourceClaim{
			Name:              claim,
			ResourceClaimName: ptr.To(claim),
		})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: claim})
	}
	return pod
}

// GPUDeviceTaintRule returns a DeviceTaintRule that taints device (e.g. GPUDeviceName(0)) of
// the gpu.nvidia.com pool of node. The server fills in the taint's TimeAdded.
func GPUDeviceTaintRule(name, node, device string, taint resourcev1.DeviceTaint) *resourcev1.DeviceTaintRule {
	return &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{
				Driver: ptr.To(GPUDriver),
				Pool:   ptr.To(node),
				Device: ptr.To(device),
			},
			Taint: taint,
		},
	}
}

// Node returns a Node object as a kubelet would register it (labels only; CreateReadyNode sets
// the status).
func Node(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			Labels: map[string]string{
				corev1.LabelHostname:   name,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: "amd64",
			},
		},
	}
}
