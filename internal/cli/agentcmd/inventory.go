package agentcmd

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/pci"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// MissingGPUs compares the backend's GPUs with those the node should have, as the inventory
// section says, and returns a placeholder for each one missing. The NVML backend is compared
// with the PCI bus (sysfs at inventory.sysfsRoot, /sys by default); the simulator only with a
// sysfs root or an expected count the configuration names, since the machine it runs on has
// other GPUs than its scenario. A sysfs that cannot be read compares with the expected count
// alone and says so once.
func MissingGPUs(ctx context.Context, inv config.InventoryConfig, backend string, devices []health.Device) []health.Device {
	if !inv.On() {
		return nil
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
