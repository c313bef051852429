// Package dratest builds the ResourceSlices and devices that tests of DRA device matching read:
// the shapes NVIDIA's DRA driver publishes, in a line each.
package dratest

import (
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Attrs are a device's attributes.
type Attrs = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute

// Slice returns the ResourceSlice name of node's pool (named after the node, generation 0, one
// slice) for driver, with devices.
func Slice(name, node, driver string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: &node,
			Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devices},
	}
}

// Device returns the device name with attributes a.
func Device(name string, a Attrs) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: a}
}

// String returns a string attribute.
func String(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: &s}
}
