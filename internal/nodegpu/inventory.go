package nodegpu

import (
	"context"
	"slices"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/pci"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// placeholderBackend is a backend that knows its own bus: the simulator, whose scenario says
// which GPUs are missing (gpus.missing).
type placeholderBackend interface {
	Placeholders() []health.Device
}

// MissingGPUs compares the backend's GPUs with those the node should have, as the inventory
// section says, and returns a placeholder for each one missing. The NVML backend is compared
// with the PCI bus (sysfs at inventory.sysfsRoot, /sys by default); the simulator with its
// scenario's bus (gpus.missing), or with a sysfs root the configuration names (never the
// machine's own: it has other GPUs than the scenario), and either with an expected count. A
// sysfs that cannot be read compares with the expected count alone and says so once.
func MissingGPUs(ctx context.Context, inv config.InventoryConfig, backend string, be interface{ Devices() []health.Device }) []health.Device {
	if !inv.On() {
		return nil
	}
	devices := be.Devices()
	if p, ok := be.(placeholderBackend); ok && inv.SysfsRoot == "" {
		known := slices.Concat(devices, p.Placeholders())
		return append(p.Placeholders(), health.MissingGPUs(known, nil, inv.ExpectedGPUs)...)
	}
	logger := klog.FromContext(ctx)
	root := inv.SysfsRoot
	if root == "" && backend == "nvml" {
		root = pci.DefaultSysfsRoot
	}
	var onBus []string
	if root != "" {
		fns, err := pci.GPUs(root)
		if err != nil {
			logger.Error(err, "Cannot list the GPUs on the PCI bus; a GPU NVML cannot open goes unseen unless inventory.expectedGPUs is set", "sysfsRoot", root)
		}
		for _, f := range fns {
			onBus = append(onBus, f.Address)
		}
	}
	missing := health.MissingGPUs(devices, onBus, inv.ExpectedGPUs)
	for _, d := range missing {
		logger.Info("A GPU the node should have is missing from the driver: reporting it Unhealthy (GPUMissing)", "gpu", d.UUID, "pciBusID", d.PCIBusID)
	}
	return missing
}
