package main

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// gpu is one whole GPU the driver serves.
type gpu struct {
	health.Device
	// name is the device's name in the ResourceSlice: gpu-<minor>, as NVIDIA's driver names it.
	name string
}

// inventory is the driver's devices: every whole GPU of the backend, in one pool named after
// the node (NVIDIA's layout). MIG instances are left out: a driver that serves them publishes
// them as devices of their own, each with its MIG UUID in uuid and its GPU's in parentUUID.
type inventory struct {
	pool   string
	byName map[string]gpu
	order  []string // device names in the backend's order
}

func newInventory(devices []health.Device, pool string) *inventory {
	inv := &inventory{pool: pool, byName: map[string]gpu{}}
	for _, d := range devices {
		if d.MIG != nil {
			continue
		}
		g := gpu{Device: d, name: fmt.Sprintf("gpu-%d", d.Minor)}
		inv.byName[g.name] = g
		inv.order = append(inv.order, g.name)
	}
	return inv
}

// names maps each GPU's UUID to its device name: what dra.Taints needs to find the device of a
// sick GPU.
func (inv *inventory) names() map[string]string {
	out := make(map[string]string, len(inv.byName))
	for name, g := range inv.byName {
		out[g.UUID] = name
	}
	return out
}

// deviceIDs maps each GPU's UUID to its pool and device: what the kubelet's health stream
// names devices by.
func (inv *inventory) deviceIDs() map[string]dra.DeviceID {
	out := make(map[string]dra.DeviceID, len(inv.byName))
	for name, g := range inv.byName {
		out[g.UUID] = dra.DeviceID{Pool: inv.pool, Device: name}
	}
	return out
}

// devices returns the slice's devices, untainted. The attributes are those NVIDIA's driver
// publishes for a whole GPU that the library knows (type, uuid, productName, brand and the
// standard PCI bus ID), plus index and minor, which selectors of older claims still use. The
// driver's version attributes and memory capacity come from NVML, which the simulator lacks.
func (inv *inventory) devices() []resourceapi.Device {
	out := make([]resourceapi.Device, 0, len(inv.order))
	for _, name := range inv.order {
		g := inv.byName[name]
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type":  {StringValue: ptr.To("gpu")},
			"uuid":  {StringValue: ptr.To(g.UUID)},
			"index": {IntValue: ptr.To(int64(g.Index))},
			"minor": {IntValue: ptr.To(int64(g.Minor))},
			"brand": {StringValue: ptr.To("Nvidia")},
		}
		if g.Model != "" {
			attrs["productName"] = resourceapi.DeviceAttribute{StringValue: ptr.To(g.Model)}
		}
		if bus := pciBusID(g.PCIBusID); bus != "" {
			attrs["resource.kubernetes.io/pciBusID"] = resourceapi.DeviceAttribute{StringValue: ptr.To(bus)}
		}
		out = append(out, resourceapi.Device{Name: name, Attributes: attrs})
	}
	return out
}

// pciBusID writes NVML's bus ID ("00000000:1B:00.0") the way the standard attribute wants it
// ("0000:1b:00.0").
func pciBusID(nvml string) string {
	s := strings.ToLower(nvml)
	if len(s) == len("00000000:1b:00.0") && strings.HasPrefix(s, "0000") {
		s = s[4:]
	}
	return s
}
