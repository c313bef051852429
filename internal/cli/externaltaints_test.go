package cli

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
)

func TestExternalTaints(t *testing.T) {
	const driver, node = "gpu.nvidia.com", "node-a"
	device := func(name, uuid string, taints ...resourceapi.DeviceTaint) resourceapi.Device {
		return resourceapi.Device{Name: name, Taints: taints, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid": {StringValue: ptr.To(uuid)},
		}}
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{
				device("gpu-0", "GPU-0", resourceapi.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}),
				device("gpu-1", "GPU-1"),
				device("gpu-2", "GPU-2"),
			},
		},
	}
	rule := func(name string, labels map[string]string, sel *resourceapi.DeviceTaintSelector, key string) resourceapi.DeviceTaintRule {
		return resourceapi.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       resourceapi.DeviceTaintRuleSpec{DeviceSelector: sel, Taint: resourceapi.DeviceTaint{Key: key, Effect: resourceapi.DeviceTaintEffectNoSchedule}},
		}
	}
	view := newDRAView([]resourceapi.ResourceSlice{*slice}, []resourceapi.DeviceTaintRule{
		// gpuhealth's own rule: not external.
		rule("gpuhealth-gpu-0", map[string]string{devicetaint.NodeLabel: node}, &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver), Pool: ptr.To(node), Device: ptr.To("gpu-0")}, "gpuhealth.dev/xid"),
		// An operator's rule on one device.
		rule("maintenance", nil, &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver), Pool: ptr.To(node), Device: ptr.To("gpu-1")}, "example.com/maintenance"),
		// A rule for another driver: not ours to show.
		rule("nics", nil, &resourceapi.DeviceTaintSelector{Driver: ptr.To("nic.example.com")}, "example.com/nic"),
	}, driver)
	rows := []GPUStatus{
		{Node: node, Index: 0, UUID: "GPU-0", Health: "Unhealthy", Reasons: []string{"XID79"}},
		{Node: node, Index: 1, UUID: "GPU-1", Health: "Healthy"},
		{Node: node, Index: 2, UUID: "GPU-2", Health: "Healthy"},
	}
	view.addExternalTaints(rows, klog.Background())

	want := map[string][]string{
		"GPU-0": {"XID79", "external:gpu.nvidia.com/xid"},
		"GPU-1": {"external:example.com/maintenance"},
		"GPU-2": nil,
	}
	for _, r := range rows {
		if !slices.Equal(r.Reasons, want[r.UUID]) {
			t.Errorf("%s: reasons %v, want %v", r.UUID, r.Reasons, want[r.UUID])
		}
	}
	if got := rows[0].ExternalTaints; len(got) != 1 || got[0].Source != "ResourceSlice" || got[0].Value != "79" || got[0].Device != node+"/gpu-0" {
		t.Errorf("GPU-0 external taints = %+v", got)
	}
	if got := rows[1].ExternalTaints; len(got) != 1 || got[0].Source != "DeviceTaintRule/maintenance" {
		t.Errorf("GPU-1 external taints = %+v", got)
	}
}
