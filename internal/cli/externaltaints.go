package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// ExternalTaint is a taint on one of a GPU's DRA devices that gpuhealth did not write: the DRA
// driver's own (NVIDIA's driver taints its slices with gpu.nvidia.com/xid, gpu-lost, unmonitored
// and keeps them until it restarts) or another DeviceTaintRule. It keeps the device out of
// scheduling whatever gpuhealth says.
type ExternalTaint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
	// Device is the DRA device (pool/name) the taint is on.
	Device string `json:"device"`
	// Source is "ResourceSlice" (the driver's) or "DeviceTaintRule/<name>".
	Source string `json:"source"`
}

// ExternalReasonPrefix marks a reason that is not gpuhealth's in the status table.
const ExternalReasonPrefix = "external:"

// draView is what status reads to find other writers' taints, indexed so that a fleet of
// 50,000 nodes costs one pass over its slices and rules, not one per node or per GPU.
type draView struct {
	// byNode holds the driver's node-local slices by node; byPool the driver's slices by pool.
	byNode, byPool map[string][]*resourceapi.ResourceSlice
	// rules are the DeviceTaintRules that are not gpuhealth's.
	rules  []resourceapi.DeviceTaintRule
	driver string
	attrs  dra.Attributes
}

// readDRAView lists the driver's ResourceSlices and every DeviceTaintRule. A user who may not
// read them gets the rest of the status and a log line: the view is extra, not essential.
func readDRAView(ctx context.Context, client kubernetes.Interface, driver string) (*draView, error) {
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	rules, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceTaintRules: %w", err)
	}
	return newDRAView(sl.Items, rules.Items, driver), nil
}

// newDRAView indexes the driver's slices and the rules that are not gpuhealth's.
func newDRAView(slices []resourceapi.ResourceSlice, rules []resourceapi.DeviceTaintRule, driver string) *draView {
	// Status assumes the attribute names of NVIDIA's driver.
	v := &draView{driver: driver, attrs: dra.DefaultAttributes(), byNode: map[string][]*resourceapi.ResourceSlice{}, byPool: map[string][]*resourceapi.ResourceSlice{}}
	for i := range slices {
		s := &slices[i]
		if s.Spec.Driver != driver {
			continue
		}
		v.byPool[s.Spec.Pool.Name] = append(v.byPool[s.Spec.Pool.Name], s)
		if s.Spec.NodeName != nil {
			v.byNode[*s.Spec.NodeName] = append(v.byNode[*s.Spec.NodeName], s)
		}
	}
	for _, r := range rules {
		if !isGPUHealthRule(r) {
			v.rules = append(v.rules, r)
		}
	}
	return v
}

// addExternalTaints fills in ExternalTaints of each row, and a reason per taint key marked with
// ExternalReasonPrefix.
func (v *draView) addExternalTaints(rows []GPUStatus, logger klog.Logger) {
	catalogs := map[string]*dra.Catalog{}
	for i := range rows {
		row := &rows[i]
		cat, ok := catalogs[row.Node]
		if !ok {
			var problems []dra.Problem
			cat, problems = dra.NewCatalog(v.byNode[row.Node], row.Node, v.driver, v.attrs)
			for _, p := range problems {
				logger.V(2).Info("ResourceSlice problem", "node", row.Node, "problem", p.String())
			}
			catalogs[row.Node] = cat
		}
		dev := health.Device{UUID: row.UUID, PCIBusID: row.PCIBusID}
		if row.ParentUUID != "" {
			dev.MIG = &health.MIGPlacement{ParentUUID: row.ParentUUID}
		}
		for _, target := range cat.Targets(dev) {
			row.ExternalTaints = append(row.ExternalTaints, v.taintsOf(target.Pool, target.Device)...)
		}
		for _, t := range row.ExternalTaints {
			if reason := ExternalReasonPrefix + t.Key; !slices.Contains(row.Reasons, reason) {
				row.Reasons = append(row.Reasons, reason)
			}
		}
	}
}

// taintsOf returns the taints other writers put on one device: in the driver's slice, and in
// DeviceTaintRules that select it and are not gpuhealth's.
func (v *draView) taintsOf(pool, name string) []ExternalTaint {
	var out []ExternalTaint
	device := pool + "/" + name
	for _, s := range v.byPool[pool] {
		for _, d := range s.Spec.Devices {
			if d.Name != name {
				continue
			}
			for _, t := range d.Taints {
				out = append(out, ExternalTaint{Key: t.Key, Value: t.Value, Effect: string(t.Effect), Device: device, Source: "ResourceSlice"})
			}
		}
	}
	for _, r := range v.rules {
		if !selects(r.Spec.DeviceSelector, v.driver, pool, name) {
			continue
		}
		t := r.Spec.Taint
		out = append(out, ExternalTaint{Key: t.Key, Value: t.Value, Effect: string(t.Effect), Device: device, Source: "DeviceTaintRule/" + r.Name})
	}
	return out
}

// isGPUHealthRule tells gpuhealth's own rules (labelled with their node) from others'.
func isGPUHealthRule(r resourceapi.DeviceTaintRule) bool {
	_, ok := r.Labels[devicetaint.NodeLabel]
	return ok && strings.HasPrefix(r.Name, "gpuhealth-")
}

// selects reports whether a rule's selector (unset fields match everything) picks the device.
func selects(sel *resourceapi.DeviceTaintSelector, driver, pool, name string) bool {
	if sel == nil {
		return true
	}
	match := func(field *string, value string) bool { return field == nil || *field == value }
	return match(sel.Driver, driver) && match(sel.Pool, pool) && match(sel.Device, name)
}
