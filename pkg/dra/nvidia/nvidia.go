// Package nvidia names what NVIDIA's DRA driver publishes: the driver name its ResourceSlices
// carry and the device attributes that tie a DRA device to a GPU (see docs/dra-devices.md).
// They are the defaults of package dra (dra.DefaultAttributes) and of the agent's configuration
// (pkg/health/config). The package imports nothing, so that the configuration, which must stay
// free of Kubernetes, can take its defaults from here rather than own them.
package nvidia

const (
	// DriverName is the name NVIDIA's DRA driver registers under.
	DriverName = "gpu.nvidia.com"
	// UUIDAttribute holds the UUID of the GPU or MIG device a DRA device is; NVIDIA's driver
	// sets it on whole GPUs, static MIG devices and VFIO passthrough devices.
	UUIDAttribute = "uuid"
	// ParentUUIDAttribute holds, on MIG devices and DynamicMIG partitions, their GPU's UUID.
	ParentUUIDAttribute = "parentUUID"
	// PCIBusIDAttribute holds a device's PCI address: the Kubernetes standard attribute, which
	// NVIDIA's driver sets on every device of a physical GPU (GPUs, MIG devices and VFIO
	// passthrough devices).
	PCIBusIDAttribute = "resource.kubernetes.io/pciBusID"
)
