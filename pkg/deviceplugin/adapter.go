// Package deviceplugin serves gpuhealth's view of GPU health to the kubelet through the device
// plugin API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1).
//
// It has three layers, each usable without the next:
//
//   - Devices and Health turn a health.Snapshot into the device list of a ListAndWatch response.
//     Device IDs are GPU UUIDs, so masking or losing a GPU never shifts the identity of another.
//     Degraded GPUs stay schedulable (Healthy); Unhealthy or drained GPUs are Unhealthy; and
//     a GPU the library declares Healthy again is sent as Healthy again (the NVIDIA and Volcano
//     device plugins never recover a GPU without a restart).
//   - Service implements the DevicePlugin gRPC service on a Source (a health.Monitor):
//     ListAndWatch sends the initial list, then one coalesced list per change; Allocate returns
//     NVIDIA_VISIBLE_DEVICES as UUIDs or CDI device names; GetPreferredAllocation prefers
//     Healthy over Degraded GPUs and packs a request onto one NUMA node.
//   - Plugin runs a Service the way the kubelet expects a device plugin to run: it serves the
//     service on a Unix socket in the kubelet's device-plugins directory, registers with the
//     kubelet, and serves and registers again whenever the kubelet restarts.
package deviceplugin

import (
	"slices"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Options choose which devices are advertised and how.
type Options struct {
	// Select picks the devices to advertise. The default advertises whole GPUs and not their MIG
	// instances (the NVIDIA device plugin's "none" MIG strategy); a plugin advertising MIG
	// instances selects those instead.
	Select func(health.Device) bool
	// NUMANode returns the NUMA node of a device, or false when unknown. Nil: no topology is
	// advertised. See SysfsNUMA.
	NUMANode func(health.Device) (int, bool)
	// Replicas time-slices each GPU: it is advertised as that many devices "<UUID>::<n>" with the
	// GPU's health (0 or 1: one device per GPU, its ID the UUID). See ReplicaID.
	Replicas int
}

// WholeGPUs selects GPUs and not their MIG instances; it is the default Options.Select.
func WholeGPUs(d health.Device) bool { return d.MIG == nil }

// MIGInstances selects MIG instances and not their parent GPUs.
func MIGInstances(d health.Device) bool { return d.MIG != nil }

func (o Options) selects(d health.Device) bool {
	if o.Select == nil {
		return WholeGPUs(d)
	}
	return o.Select(d)
}

// Health returns the device-plugin health of a device: Unhealthy when the library says
// Unhealthy (a fault or an administrative drain: stop new work), Healthy otherwise. A Degraded
// GPU works, so it stays schedulable; a GPU the backend cannot watch is not known to be broken.
func Health(d health.DeviceStatus) string {
	if d.Health == health.Unhealthy {
		return pluginapi.Unhealthy
	}
	return pluginapi.Healthy
}

// Devices returns the ListAndWatch device list of a snapshot: one device per selected GPU, its
// ID the UUID (or Options.Replicas replicas of it, each with the GPU's health), in the snapshot's
// order (by index).
func Devices(snap health.Snapshot, opts Options) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(snap.Devices)*max(opts.Replicas, 1))
	for _, d := range snap.Devices {
		if !opts.selects(d.Device) {
			continue
		}
		var topology *pluginapi.TopologyInfo
		if opts.NUMANode != nil {
			if n, ok := opts.NUMANode(d.Device); ok {
				topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(n)}}}
			}
		}
		for _, id := range opts.deviceIDs(d.Device.UUID) {
			out = append(out, &pluginapi.Device{ID: id, Health: Health(d), Topology: topology})
		}
	}
	return out
}

// Equal reports whether two device lists say the same thing to the kubelet: the same IDs in
// the same order with the same health and topology.
func Equal(a, b []*pluginapi.Device) bool {
	return slices.EqualFunc(a, b, func(x, y *pluginapi.Device) bool {
		return x.GetID() == y.GetID() && x.GetHealth() == y.GetHealth() &&
			slices.EqualFunc(x.GetTopology().GetNodes(), y.GetTopology().GetNodes(), func(m, n *pluginapi.NUMANode) bool {
				return m.GetID() == n.GetID()
			})
	})
}

// Unhealthy returns the IDs of the Unhealthy devices of a list, for logging.
func Unhealthy(devs []*pluginapi.Device) []string {
	var ids []string
	for _, d := range devs {
		if d.GetHealth() == pluginapi.Unhealthy {
			ids = append(ids, d.GetID())
		}
	}
	return ids
}

// sysfsPCIAddress turns NVML's PCI bus ID ("00000000:C4:00.0", an eight-digit domain) into the
// name sysfs uses ("0000:c4:00.0"); what is no PCI address stays as it is, in lower case.
func sysfsPCIAddress(busID string) string {
	if n, err := health.NormalizePCIBusID(busID); err == nil {
		return n
	}
	return strings.ToLower(busID)
}
