package nodegpu

import (
	"context"
	"fmt"
	"slices"
	"strings"

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

// EventGPUBoundToOtherDriver is the reason of the Event that names the GPUs on the bus left out
// of the comparison because another driver holds them (inventory.otherDrivers: leaveOut).
const EventGPUBoundToOtherDriver = "GPUBoundToOtherDriver"

// MissingGPUs compares the backend's GPUs with those the node should have, as the inventory
// section says, and returns a placeholder for each one missing. The NVML backend is compared
// with the PCI bus (sysfs at inventory.sysfsRoot, /sys by default); the simulator with its
// scenario's bus (gpus.missing), or with a sysfs root the configuration names (never the
// machine's own: it has other GPUs than the scenario), and either with an expected count. A
// sysfs that cannot be read compares with the expected count alone and says so once.
//
// A GPU on the bus bound to a driver other than NVIDIA's (vfio-pci: passed through to a virtual
// machine) was given away on purpose: by default it is left out, neither watched nor missing
// (it still counts towards the expected count: the node has it), and returned in leftOut for
// the caller to report (LeftOutMessage); with inventory.otherDrivers set to missing it counts
// missing like a GPU no driver holds. What is not as the kernel writes sysfs (a function
// skipped, more GPUs than a node holds) and the GPUs left out are logged once here.
func MissingGPUs(ctx context.Context, inv config.InventoryConfig, backend string, be interface{ Devices() []health.Device }) (missing []health.Device, leftOut []pci.Function) {
	if !inv.On() {
		return nil, nil
	}
	devices := be.Devices()
	if p, ok := be.(placeholderBackend); ok && inv.SysfsRoot == "" {
		known := slices.Concat(devices, p.Placeholders())
		return append(p.Placeholders(), health.MissingGPUs(known, nil, inv.ExpectedGPUs)...), nil
	}
	logger := klog.FromContext(ctx)
	root := inv.SysfsRoot
	if root == "" && backend == "nvml" {
		root = pci.DefaultSysfsRoot
	}
	var onBus []string
	if root != "" {
		for _, f := range busGPUs(logger, root) {
			if f.OtherDriver() && !inv.OtherDriversMissingOn() {
				leftOut = append(leftOut, f)
				continue
			}
			onBus = append(onBus, f.Address)
		}
		if len(onBus) > health.MaxGPUs {
			logger.Info("The PCI bus lists more NVIDIA GPUs than a node holds: only the first are compared, the rest are not tracked", "sysfsRoot", root, "onBus", len(onBus), "max", health.MaxGPUs)
		}
	}
	if len(leftOut) > 0 {
		logger.Info("GPUs bound to another driver are left out: neither watched nor counted missing (inventory.otherDrivers: missing counts them)", "gpus", describeLeftOut(leftOut), "count", len(leftOut))
	}
	// A GPU given to another driver is one of those the node should have, not one missing.
	missing = health.MissingGPUs(devices, onBus, max(inv.ExpectedGPUs-len(leftOut), 0))
	for _, d := range missing {
		logger.Info("A GPU the node should have is missing from the driver: reporting it Unhealthy (GPUMissing)", "gpu", d.UUID, "pciBusID", d.PCIBusID)
	}
	return missing, leftOut
}

// busGPUs lists the NVIDIA GPUs on the PCI bus under root; what cannot be listed or read is
// logged.
func busGPUs(logger klog.Logger, root string) []pci.Function {
	fns, skipped, err := pci.GPUs(root)
	if err != nil {
		logger.Error(err, "Cannot list the GPUs on the PCI bus; a GPU NVML cannot open goes unseen unless inventory.expectedGPUs is set", "sysfsRoot", root)
	}
	if len(skipped) > 0 {
		why := make([]string, len(skipped))
		for i, s := range skipped {
			why[i] = s.Address + ": " + s.Err.Error()
		}
		logger.Info("PCI functions skipped: what sysfs holds for them is not what the kernel writes, so they are not known to be GPUs that should be there", "sysfsRoot", root, "functions", listed(why), "count", len(skipped))
	}
	return fns
}

// LeftOutMessage is the message of the EventGPUBoundToOtherDriver Event for the GPUs leftOut:
// the first few by address with their driver, and how many more. It stays under 1 KiB, the most an
// Event's note may hold, however many there are.
func LeftOutMessage(leftOut []pci.Function) string {
	return "GPUs bound to another driver are left out of the inventory, neither watched nor counted missing (inventory.otherDrivers: leaveOut): " + describeLeftOut(leftOut)
}

// describeLeftOut names the first few of leftOut: "0000:3b:00.0 (vfio-pci), ...".
func describeLeftOut(leftOut []pci.Function) string {
	names := make([]string, len(leftOut))
	for i, f := range leftOut {
		names[i] = f.Address + " (" + f.Driver + ")"
	}
	return listed(names)
}

// maxListed is how many items a log line or an Event names before it only counts the rest.
const maxListed = 8

// listed joins the first maxListed items and counts the others.
func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:maxListed], ", "), len(items)-maxListed)
}
