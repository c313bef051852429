package main

import (
	"context"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// publisher is what publishSlices needs of kubeletplugin.Helper.
type publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// subscriber is what publishSlices needs of health.Monitor.
type subscriber interface {
	Subscribe() *health.Subscription
}

// publishSlices publishes the driver's ResourceSlice at once, then again whenever the taints
// its GPUs' health asks for change, until ctx ends. A subscription coalesces: a storm of faults
// is one republish with the latest state, and a change that taints nothing new (a second
// condition on a GPU already tainted for a worse one) none.
func publishSlices(ctx context.Context, src subscriber, p publisher, inv *inventory, opts dra.TaintOptions) error {
	logger := klog.FromContext(ctx)
	sub := src.Subscribe() // starts with the current snapshot pending: the first publish
	defer sub.Close()
	names := inv.names()
	var last map[string][]resourceapi.DeviceTaint
	published := false
	for {
		u, ok := sub.Wait(ctx)
		if !ok {
			return nil
		}
		taints := dra.Taints(u.Snapshot, names, opts)
		if published && apiequality.Semantic.DeepEqual(taints, last) {
			continue
		}
		devices := inv.devices()
		dra.SetTaints(devices, taints)
		resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			inv.pool: {Slices: []resourceslice.Slice{{Devices: devices}}},
		}}
		// The helper's ResourceSlice controller writes in the background, retries and
		// keeps the slice as published; an error here means it could not start at all.
		if err := p.PublishResources(ctx, resources); err != nil {
			return fmt.Errorf("publish the ResourceSlice: %w", err)
		}
		logger.Info("Published the ResourceSlice", "devices", len(devices), "tainted", slices.Sorted(maps.Keys(taints)))
		last, published = taints, true
	}
}
