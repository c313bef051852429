package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/dra/healthstream"
)

// driver implements kubeletplugin.DRAPlugin: the kubelet calls it through the helper's gRPC
// servers to prepare and unprepare claims and to watch device health.
type driver struct {
	name      string
	inventory *inventory
	cdi       cdiWriter
	health    *healthstream.HealthReporter
	// fail stops the driver when the helper reports an error it cannot recover from.
	fail context.CancelCauseFunc
}

var _ kubeletplugin.DRAPlugin = (*driver)(nil)

// PrepareResourceClaims writes one CDI spec per claim (the claim's GPUs in
// NVIDIA_VISIBLE_DEVICES) and returns a CDI device per allocated GPU. It holds no state: the
// spec file, named after the claim's UID, is the record, so a restarted driver prepares again
// (idempotently) and unprepares what an earlier process prepared.
func (d *driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.prepare(ctx, claim)
	}
	return out, nil
}

func (d *driver) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim))
	if claim.Status.Allocation == nil {
		// The helper checks this already; a driver must never hand out a device it was not given.
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s is not allocated", klog.KObj(claim))}
	}
	var allocated []cdiDevice
	var devices []kubeletplugin.Device
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue // another driver's device in the same claim
		}
		g, ok := d.inventory.byName[r.Device]
		if r.Pool != d.inventory.pool || !ok {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s: device %s/%s is not on this node", klog.KObj(claim), r.Pool, r.Device)}
		}
		dev := cdiDevice{name: string(claim.UID) + "-" + r.Device, gpu: g}
		allocated = append(allocated, dev)
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{r.Request},
			PoolName:     r.Pool,
			DeviceName:   r.Device,
			CDIDeviceIDs: []string{d.cdi.qualifiedName(dev.name)},
		})
	}
	if err := d.cdi.write(claim.UID, allocated); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	logger.V(2).Info("Prepared", "devices", len(devices))
	return kubeletplugin.PrepareResult{Devices: devices}
}

// UnprepareResourceClaims removes each claim's CDI spec; a claim never prepared here is fine.
func (d *driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		out[claim.UID] = d.cdi.remove(claim.UID)
		klog.FromContext(ctx).V(2).Info("Unprepared", "claim", claim.NamespacedName, "err", out[claim.UID])
	}
	return out, nil
}

// HandleError is called for errors in the helper's background work (publishing slices, its
// gRPC servers). Recoverable ones are logged; any other stops the driver.
func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.fail(fmt.Errorf("%s: %w", msg, err))
	}
}

// WatchHealthStatus streams the GPUs' health to the kubelet, which shows it in the status of
// pods using them (allocatedResourcesStatus). healthstream does the whole job: a full report at
// once, one per change, and resends within the kubelet's health-check timeout.
func (d *driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.health.WatchHealthStatus(ctx, reports)
}

// cdiVendor is the CDI vendor of the driver's devices: k8s.<driver name>, as NVIDIA's driver uses
// (k8s.gpu.nvidia.com), apart from the devices of the NVIDIA container toolkit.
func cdiVendor(driverName string) string { return "k8s." + strings.ToLower(driverName) }
