package dradevices_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/report/dradevices"
)

func slice(name, node, driver string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devices},
	}
}

func dev(name string, attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: attrs}
}

func TestIndexFindsGPUsByBareAndQualifiedUUIDs(t *testing.T) {
	client := fake.NewClientset(
		slice("a", "n1", "gpu.nvidia.com",
			dev("gpu-0", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-A")}}),
			dev("gpu-1", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"gpu.nvidia.com/uuid": {StringValue: ptr.To("GPU-B")}}),
			dev("nic-0", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"mac": {StringValue: ptr.To("aa")}}),
			dev("gpu-2", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {IntValue: ptr.To[int64](3)}}),
		),
		slice("b", "n2", "gpu.nvidia.com", dev("gpu-0", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-C")}})),
		slice("c", "n1", "other.driver", dev("gpu-0", map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To("GPU-D")}})),
	)
	ix := dradevices.New(client, "n1", "gpu.nvidia.com", "uuid")
	if err := ix.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	byUUID, err := ix.ByUUID()
	if err != nil {
		t.Fatal(err)
	}
	if len(byUUID) != 2 || byUUID["gpu-a"][0] != (dradevices.Device{Pool: "n1", Name: "gpu-0"}) || byUUID["gpu-b"][0].Name != "gpu-1" {
		t.Errorf("ByUUID = %v, want GPU-A and GPU-B of n1's gpu.nvidia.com slice only", byUUID)
	}
	uuids, err := ix.UUIDs()
	if err != nil {
		t.Fatal(err)
	}
	if uuids[dradevices.Device{Pool: "n1", Name: "gpu-1"}] != "gpu-b" || len(uuids) != 2 {
		t.Errorf("UUIDs = %v", uuids)
	}
}
