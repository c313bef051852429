// Package dra helps a DRA driver that publishes its own ResourceSlices report GPU health from
// the gpuhealth library:
//
//   - Taints turns a health.Snapshot into resource.k8s.io/v1 device taints for the driver's own
//     devices, with the keys and effects of gpuhealth's DeviceTaintRules (a driver puts them in
//     its slices' device.taints; the scheduler then keeps new claims off sick GPUs). SetTaints
//     writes them into a device list, leaving other taints alone.
//   - Message says why a device is not Healthy, in the words and length the kubelet keeps.
//   - Catalog says which DRA devices a GPU's health applies to, read from ResourceSlices the way
//     NVIDIA's DRA driver publishes them (Attributes): a whole GPU reaches its own device, every
//     device naming it as parent (static MIG devices, DynamicMIG partitions) and every device at
//     its PCI address (a VFIO passthrough device); a MIG device reaches the device carrying its
//     own UUID. Assign picks the worst status per device; NormalizePCIBusID turns NVML's PCI
//     addresses into the standard attribute's form. gpuhealth's agent taints and reports claim
//     status through it; a driver with MIG, DynamicMIG or VFIO devices can match the same way.
//   - PodClaimNames lists the ResourceClaims a pod uses (named, templated, extended resources).
//   - Package healthstream (a sub-package, because it needs the kubelet's gRPC API and
//     client-go) implements the kubelet's DRA device-health stream through the
//     k8s.io/dynamic-resource-allocation kubeletplugin helper (DRAPlugin.WatchHealthStatus), so
//     that pod status allocatedResourcesStatus shows each allocated GPU Healthy, Unhealthy or
//     Unknown.
//
// This package imports only k8s.io/api and k8s.io/apimachinery types, never client-go: a driver
// embeds it whatever client it uses (TestNoClientGo holds it to that).
//
// Taints matches GPUs to the driver's devices by UUID (case-insensitively): the driver says which
// of its devices carries which GPU. Catalog matches them by the published attributes instead.
package dra

import (
	"slices"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// TaintKeyPrefix starts the key of every taint gpuhealth writes, in slices and in rules.
const TaintKeyPrefix = "gpuhealth.dev/"

// TaintOptions configure Taints.
type TaintOptions struct {
	// NoExecute lets conditions that ask for eviction use the NoExecute effect (off by default,
	// as in the agent: evicting running work is a decision an operator opts into).
	NoExecute bool
}

// Taints returns the taints of the driver's devices, keyed by device name, for every GPU of snap
// that is not Healthy and that devices (GPU UUID → the driver's device name) maps. Each gets one
// taint, the same the agent's DeviceTaintRule would carry:
//
//   - key gpuhealth.dev/<worst condition> (xid, gpu-lost, thermal, ecc-uncorrected, ...);
//   - value the XID for XID conditions, else the condition's reason;
//   - effect None for Degraded, NoSchedule for Unhealthy, NoExecute for conditions asking for
//     eviction when opts.NoExecute;
//   - timeAdded when the worst condition began, to the second, so that republishing an
//     unchanged slice changes nothing.
//
// Healthy GPUs and devices with no GPU in snap get no entry.
func Taints(snap health.Snapshot, devices map[string]string, opts TaintOptions) map[string][]resourceapi.DeviceTaint {
	byUUID := make(map[string]string, len(devices))
	for uuid, name := range devices {
		byUUID[strings.ToLower(uuid)] = name
	}
	out := map[string][]resourceapi.DeviceTaint{}
	for _, d := range snap.Devices {
		name, ok := byUUID[strings.ToLower(d.Device.UUID)]
		if !ok || d.Health == health.Healthy {
			continue
		}
		out[name] = append(out[name], Taint(d, opts))
	}
	return out
}

// Taint returns the taint of one device that is not Healthy (see Taints).
func Taint(d health.DeviceStatus, opts TaintOptions) resourceapi.DeviceTaint {
	key, value := TaintKeyValue(d)
	t := resourceapi.DeviceTaint{Key: key, Value: value, Effect: TaintEffect(d, opts.NoExecute)}
	if conds := health.WorstFirst(d.Conditions); len(conds) > 0 && !conds[0].Since.IsZero() {
		at := metav1.NewTime(conds[0].Since.Truncate(time.Second))
		t.TimeAdded = &at
	}
	return t
}

// SetTaints replaces the gpuhealth taints (keys starting with TaintKeyPrefix) of every device in
// devs with those taints lists for its name, keeping every other taint and its order. A device
// without an entry loses its gpuhealth taints: its GPU recovered.
func SetTaints(devs []resourceapi.Device, taints map[string][]resourceapi.DeviceTaint) {
	for i := range devs {
		kept := slices.DeleteFunc(slices.Clone(devs[i].Taints), func(t resourceapi.DeviceTaint) bool {
			return strings.HasPrefix(t.Key, TaintKeyPrefix)
		})
		kept = append(kept, taints[devs[i].Name]...)
		if len(kept) == 0 {
			kept = nil
		}
		devs[i].Taints = kept
	}
}
