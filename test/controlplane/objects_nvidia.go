package controlplane

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The fixtures in this file reproduce the ResourceSlices of NVIDIA's DRA driver as it publishes
// them now (cmd/gpu-kubelet-plugin of the driver; see docs/dra-devices.md for the functions
// each shape comes from). Unlike GPUResourceSlice they name devices by the GPU's minor number,
// not its index, and carry no index or minor attribute; MIG devices carry parentUUID and, only
// when static, uuid; VFIO devices carry a uuid derived from the PCI address. Every device of a
// GPU carries the standard attribute resource.kubernetes.io/pciBusID.

// NVIDIAGPU is one physical GPU as NVIDIA's DRA driver sees it.
type NVIDIAGPU struct {
	UUID string
	// Minor is the GPU's /dev/nvidiaN number. The driver names the GPU's devices after it
	// (gpu-<minor>); it need not equal the NVML index.
	Minor int
	// PCIBusID is the GPU's PCI address as the standard attribute writes it ("0000:1b:00.0");
	// NVML's form ("00000000:1B:00.0") is accepted and rewritten.
	PCIBusID string
	NUMANode int
	// MIG lists static MIG devices: MIG mode is on and an admin created these instances. The
	// driver then publishes them instead of the whole GPU, and no VFIO device for it.
	MIG []NVIDIAMIGDevice
}

// NVIDIAMIGDevice is a static MIG device: an H100 MIG instance that exists, with its UUID.
type NVIDIAMIGDevice struct {
	UUID           string
	Profile        string // an H100 profile name, such as "1g.10gb"
	PlacementStart int
}

// Attributes of the fake H100s; GPUs of the driver's current release.
const (
	nvidiaDriverVersion = "580.95.5"
	nvidiaCUDAVersion   = "13.0.0"
	h100MemoryMiB       = 81559
	h100PCIDeviceName   = "GH100 [H100 SXM5 80GB]"
	h100PCIDeviceID     = "0x2330"
	h100BAR1Bytes       = 128 << 30
)

// HGXH100 returns the eight GPUs of an HGX H100 board on node: UUIDs derived from the node's
// name, the PCI addresses of a typical 8-GPU server, and minor numbers that differ from the
// NVML index (index i is the i-th PCI address; the kernel numbered the devices differently).
func HGXH100(node string) []NVIDIAGPU {
	buses := []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}
	minors := HGXH100Minors()
	gpus := make([]NVIDIAGPU, len(buses))
	for i, bus := range buses {
		h := sha256.Sum256([]byte(node + "/hgx/" + strconv.Itoa(i)))
		gpus[i] = NVIDIAGPU{
			UUID:     fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16]),
			Minor:    minors[i],
			PCIBusID: fmt.Sprintf("0000:%02x:00.0", bus),
			NUMANode: i / 4,
		}
	}
	return gpus
}

// HGXH100Minors returns the minor number of the GPU at each NVML index in HGXH100.
func HGXH100Minors() []int { return []int{2, 3, 0, 1, 6, 7, 4, 5} }

// NVIDIAGPUDeviceName is the driver's name for a whole GPU: gpu-<minor>.
func NVIDIAGPUDeviceName(minor int) string { return fmt.Sprintf("gpu-%d", minor) }

// NVIDIAVFIODeviceName is the driver's name for the VFIO device of the i-th NVIDIA GPU in PCI
// address order: gpu-vfio-<i>.
func NVIDIAVFIODeviceName(i int) string { return fmt.Sprintf("gpu-vfio-%d", i) }

// NVIDIAVFIOUUID is the uuid the driver gives a VFIO device: a name-based (SHA-1) UUID of the
// PCI address in the DNS namespace, not the GPU's UUID.
func NVIDIAVFIOUUID(pciBusID string) string {
	return uuid.NewSHA1(uuid.NameSpaceDNS, []byte(normalizeBusID(pciBusID))).String()
}

// NVIDIAResourceSlice returns the one ResourceSlice the driver publishes for node with its
// default feature gates: every GPU as gpu-<minor> (uuid, productName, type=gpu, versions, PCI
// attributes, memory capacity), or, for a GPU with static MIG devices, those devices (uuid,
// parentUUID, profile, type=mig, memorySliceN capacities).
func NVIDIAResourceSlice(node string, gpus ...NVIDIAGPU) (*resourcev1.ResourceSlice, error) {
	devices, err := nvidiaDevices(gpus)
	if err != nil {
		return nil, err
	}
	return nvidiaSlices(node, []resourcev1.ResourceSliceSpec{{Devices: devices}})[0], nil
}

// NVIDIAPassthroughResourceSlice is NVIDIAResourceSlice with the PassthroughSupport feature gate
// on: each GPU without static MIG devices is published twice, as gpu-<minor> and as the VFIO
// device gpu-vfio-<i> (i: the GPU's position in PCI address order), whose uuid is derived from
// the PCI address (NVIDIAVFIOUUID) and whose type is vfio.
func NVIDIAPassthroughResourceSlice(node string, gpus ...NVIDIAGPU) (*resourcev1.ResourceSlice, error) {
	devices, err := nvidiaDevices(gpus)
	if err != nil {
		return nil, err
	}
	for i, g := range byBusID(gpus) {
		if len(g.MIG) == 0 {
			devices = append(devices, g.vfioDevice(i))
		}
	}
	sortDevices(devices)
	return nvidiaSlices(node, []resourcev1.ResourceSliceSpec{{Devices: devices}})[0], nil
}

// NVIDIADynamicMIGResourceSlices returns the slices the driver publishes for node with the
// DynamicMIG feature gate on a Kubernetes 1.35+ API server ("split" slices): first one with the
// shared counters of every GPU (gpu-<minor>-counter-set: the full GPU's capacities and
// memory-slice-N counters), then one per GPU in PCI address order with the whole GPU and every
// possible MIG partition of the H100 profiles (gpu-<minor>-mig-<profile>-<id>-<start>), each
// consuming its share of the counters. Partitions carry parentUUID and no uuid: they are
// abstract until a claim gets one. Static MIG devices are ignored (the driver destroys them).
// The API server allows at most 8 counter sets in a slice, so at most 8 GPUs.
func NVIDIADynamicMIGResourceSlices(node string, gpus ...NVIDIAGPU) []*resourcev1.ResourceSlice {
	counters := resourcev1.ResourceSliceSpec{}
	specs := []resourcev1.ResourceSliceSpec{{}}
	for _, g := range byBusID(gpus) {
		counters.SharedCounters = append(counters.SharedCounters, g.counterSet())
		specs = append(specs, resourcev1.ResourceSliceSpec{Devices: g.dynamicMIGDevices()})
	}
	specs[0] = counters
	return nvidiaSlices(node, specs)
}

// nvidiaSlices turns specs into the slices of node's pool, in generation 1.
func nvidiaSlices(node string, specs []resourcev1.ResourceSliceSpec) []*resourcev1.ResourceSlice {
	out := make([]*resourcev1.ResourceSlice, len(specs))
	for i, spec := range specs {
		spec.Driver = GPUDriver
		spec.NodeName = ptr.To(node)
		spec.Pool = resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(specs))}
		out[i] = &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, GPUDriver, i)}, Spec: spec}
	}
	return out
}

// nvidiaDevices are the devices of the default mode: whole GPUs, or their static MIG devices.
func nvidiaDevices(gpus []NVIDIAGPU) ([]resourcev1.Device, error) {
	var devices []resourcev1.Device
	for _, g := range gpus {
		if len(g.MIG) == 0 {
			devices = append(devices, g.wholeDevice())
			continue
		}
		for _, m := range g.MIG {
			d, err := g.staticMIGDevice(m)
			if err != nil {
				return nil, err
			}
			devices = append(devices, d)
		}
	}
	sortDevices(devices)
	return devices, nil
}

func sortDevices(devices []resourcev1.Device) {
	slices.SortFunc(devices, func(a, b resourcev1.Device) int { return strings.Compare(a.Name, b.Name) })
}

func byBusID(gpus []NVIDIAGPU) []NVIDIAGPU {
	out := slices.Clone(gpus)
	slices.SortStableFunc(out, func(a, b NVIDIAGPU) int { return cmp.Compare(normalizeBusID(a.PCIBusID), normalizeBusID(b.PCIBusID)) })
	return out
}

// commonAttributes are the attributes every device of the GPU carries.
func (g NVIDIAGPU) commonAttributes() map[resourcev1.QualifiedName]resourcev1.DeviceAttribute {
	bus := normalizeBusID(g.PCIBusID)
	return map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"productName":                     str(fakeGPUProduct),
		"brand":                           str("Nvidia"),
		"architecture":                    str(fakeGPUArch),
		"cudaComputeCapability":           {VersionValue: ptr.To("9.0.0")},
		"driverVersion":                   {VersionValue: ptr.To(nvidiaDriverVersion)},
		"cudaDriverVersion":               {VersionValue: ptr.To(nvidiaCUDAVersion)},
		"resource.kubernetes.io/pciBusID": str(bus),
		"resource.kubernetes.io/pcieRoot": str("pci" + bus[:len(bus)-len("0:00.0")] + "0"),
		"resource.kubernetes.io/numaNode": {IntValue: ptr.To(int64(g.NUMANode))},
	}
}

// wholeDevice is the GPU as gpu-<minor> (the driver's GpuInfo.GetDevice).
func (g NVIDIAGPU) wholeDevice() resourcev1.Device {
	attrs := g.commonAttributes()
	attrs["type"] = str("gpu")
	attrs["uuid"] = str(g.UUID)
	return resourcev1.Device{
		Name: NVIDIAGPUDeviceName(g.Minor), Attributes: attrs,
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": quantity(h100MemoryMiB << 20)},
	}
}

// vfioDevice is the GPU as the VFIO device gpu-vfio-<i> (the driver's VfioDeviceInfo.GetDevice).
func (g NVIDIAGPU) vfioDevice(i int) resourcev1.Device {
	bus := normalizeBusID(g.PCIBusID)
	return resourcev1.Device{
		Name: NVIDIAVFIODeviceName(i),
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"type":                            str("vfio"),
			"uuid":                            str(NVIDIAVFIOUUID(bus)),
			"deviceID":                        str(h100PCIDeviceID),
			"vendorID":                        str("0x10de"),
			"numa":                            {IntValue: ptr.To(int64(g.NUMANode))},
			"productName":                     str(h100PCIDeviceName),
			"iommuFDEnabled":                  {BoolValue: ptr.To(false)},
			"resource.kubernetes.io/pciBusID": str(bus),
			"resource.kubernetes.io/pcieRoot": g.commonAttributes()["resource.kubernetes.io/pcieRoot"],
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"addressableMemory": quantity(h100BAR1Bytes)},
	}
}

// normalizeBusID rewrites NVML's "00000000:1B:00.0" as "0000:1b:00.0"; other forms stay.
func normalizeBusID(s string) string {
	if n, err := health.NormalizePCIBusID(s); err == nil {
		return n
	}
	return strings.ToLower(s)
}

func str(s string) resourcev1.DeviceAttribute {
	return resourcev1.DeviceAttribute{StringValue: ptr.To(s)}
}
