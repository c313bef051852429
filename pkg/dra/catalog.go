package dra

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Catalog is what ties the devices of one node and driver to GPUs, read from its ResourceSlices
// at one moment. It is built by NewCatalog (the agent's informer cache, internal/cache/dradevices,
// builds one per read) and never changes.
type Catalog struct {
	own    map[string][]DeviceID // by the UUID attribute (lower case)
	parent map[string][]DeviceID // by the parent UUID attribute (lower case)
	bus    map[string][]DeviceID // by the PCI bus ID attribute (normalized)
	known  map[DeviceID]bool
	// gpus are the physical GPUs: "bus:<address>", or "uuid:<uuid>" for a device with neither an
	// address nor a parent.
	gpus map[string]bool
}

// PhysicalGPUs is how many GPUs the devices belong to: one per PCI address (a GPU, its MIG
// partitions and its VFIO device share one), plus a device with neither an address nor a
// parent UUID for itself.
func (c *Catalog) PhysicalGPUs() int { return len(c.gpus) }

// Problem is something in the slices that keeps a device, or one of its attributes, from being
// matched as published. Matching carries on without it.
type Problem struct {
	Pool, Device, Attribute, What string
}

func (p Problem) String() string {
	if p.Attribute == "" {
		return fmt.Sprintf("device %s/%s: %s", p.Pool, p.Device, p.What)
	}
	return fmt.Sprintf("device %s/%s: attribute %s %s", p.Pool, p.Device, p.Attribute, p.What)
}

// NewCatalog reads the devices of node and driver in slices. Like the scheduler, it uses only the
// newest generation of each pool. Attribute values that are missing, not strings, empty,
// malformed or contradictory are left out and returned as problems, sorted; so is a device
// published twice or a UUID on more than one device (which is still matched: tainting both is
// the safe side).
func NewCatalog(list []*resourceapi.ResourceSlice, node, driver string, attrs Attributes) (*Catalog, []Problem) {
	c := &Catalog{own: map[string][]DeviceID{}, parent: map[string][]DeviceID{}, bus: map[string][]DeviceID{}, known: map[DeviceID]bool{}, gpus: map[string]bool{}}
	var problems []Problem
	for _, slice := range newest(list, node, driver) {
		for i := range slice.Spec.Devices {
			dev := &slice.Spec.Devices[i]
			key := DeviceID{Pool: slice.Spec.Pool.Name, Device: dev.Name}
			if c.known[key] {
				problems = append(problems, Problem{Pool: key.Pool, Device: key.Device, What: "is published more than once in the pool's newest generation; the first is used"})
				continue
			}
			c.known[key] = true
			problems = append(problems, c.add(key, dev, driver, attrs)...)
		}
	}
	for uuid, devs := range c.own {
		if len(devs) > 1 {
			names := make([]string, len(devs))
			for i, d := range devs {
				names[i] = d.Pool + "/" + d.Device
			}
			problems = append(problems, Problem{Attribute: attrs.UUID, Pool: devs[0].Pool, Device: devs[0].Device,
				What: fmt.Sprintf("value %q is on %d devices (%s); all of them are tainted with it", uuid, len(devs), strings.Join(names, ", "))})
		}
	}
	slices.SortFunc(problems, func(a, b Problem) int { return strings.Compare(a.String(), b.String()) })
	return c, problems
}

// newest returns the slices of node and driver in the newest generation of their pool, sorted
// by pool and name so that everything built from them is deterministic.
func newest(list []*resourceapi.ResourceSlice, node, driver string) []*resourceapi.ResourceSlice {
	gen := map[string]int64{}
	var out []*resourceapi.ResourceSlice
	for _, s := range list {
		if s == nil || s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		if g, ok := gen[s.Spec.Pool.Name]; !ok || s.Spec.Pool.Generation > g {
			gen[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
		out = append(out, s)
	}
	out = slices.DeleteFunc(out, func(s *resourceapi.ResourceSlice) bool { return s.Spec.Pool.Generation != gen[s.Spec.Pool.Name] })
	slices.SortFunc(out, func(a, b *resourceapi.ResourceSlice) int {
		return cmp.Or(strings.Compare(a.Spec.Pool.Name, b.Spec.Pool.Name), strings.Compare(a.Name, b.Name))
	})
	return out
}

// add records what ties one device to a GPU.
func (c *Catalog) add(key DeviceID, dev *resourceapi.Device, driver string, attrs Attributes) []Problem {
	var problems []Problem
	get := func(name string) string {
		v, what := lookup(dev.Attributes, driver, name)
		if what != "" {
			problems = append(problems, Problem{Pool: key.Pool, Device: key.Device, Attribute: name, What: what})
		}
		return v
	}
	uuid, parent, bus := strings.ToLower(get(attrs.UUID)), strings.ToLower(get(attrs.ParentUUID)), get(attrs.PCIBusID)
	if bus != "" {
		norm, err := NormalizePCIBusID(bus)
		if err != nil {
			problems = append(problems, Problem{Pool: key.Pool, Device: key.Device, Attribute: attrs.PCIBusID, What: "is not a PCI address: " + err.Error()})
		}
		bus = norm
	}
	if uuid != "" {
		c.own[uuid] = append(c.own[uuid], key)
	}
	if parent != "" {
		c.parent[parent] = append(c.parent[parent], key)
	}
	if bus != "" {
		c.bus[bus] = append(c.bus[bus], key)
	}
	switch {
	case bus != "":
		c.gpus["bus:"+bus] = true
	case uuid != "" && parent == "":
		c.gpus["uuid:"+uuid] = true
	}
	if uuid == "" && parent == "" && bus == "" && len(problems) == 0 {
		problems = append(problems, Problem{Pool: key.Pool, Device: key.Device,
			What: fmt.Sprintf("carries none of %s, %s and %s, so no GPU fault can taint it", attrs.UUID, attrs.ParentUUID, attrs.PCIBusID)})
	}
	return problems
}

// lookup returns the string value of attribute name, bare or qualified with the driver's domain,
// or why it cannot be used.
func lookup(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, driver, name string) (value, problem string) {
	names := []string{name}
	if bare, ok := strings.CutPrefix(name, driver+"/"); ok {
		names = append(names, bare)
	} else if !strings.Contains(name, "/") {
		names = append(names, driver+"/"+name)
	}
	found := false
	for _, n := range names {
		a, ok := attrs[resourceapi.QualifiedName(n)]
		if !ok {
			continue
		}
		switch {
		case a.StringValue == nil:
			return "", "is not a string"
		case *a.StringValue == "":
			return "", "is empty"
		case found && *a.StringValue != value:
			return "", fmt.Sprintf("is given twice with different values (%q and %q)", value, *a.StringValue)
		}
		value, found = *a.StringValue, true
	}
	return value, ""
}

// Target is a DRA device that a GPU's health applies to.
type Target struct {
	DeviceID
	// Own is set for the device that is the GPU or MIG device itself (its UUID attribute carries
	// the device's UUID), and clear for one found through its parent GPU or PCI address.
	Own bool
}

// Targets returns the DRA devices that d's health applies to, the device's own first, then by
// pool and name. A whole GPU reaches its own device, every device that names it as parent (static
// MIG devices and dynamic MIG partitions) and every device at its PCI address (a VFIO
// passthrough device). A MIG device reaches only the device carrying its own UUID: the slices
// say which DRA device a live MIG instance is only for static MIG.
func (c *Catalog) Targets(d health.Device) []Target {
	uuid := strings.ToLower(d.UUID)
	if uuid == "" {
		return nil
	}
	seen := map[DeviceID]bool{}
	var out []Target
	add := func(devs []DeviceID, own bool) {
		for _, dev := range devs {
			if !seen[dev] {
				seen[dev] = true
				out = append(out, Target{DeviceID: dev, Own: own})
			}
		}
	}
	add(c.own[uuid], true)
	if d.MIG == nil {
		add(c.parent[uuid], false)
		if bus, err := NormalizePCIBusID(d.PCIBusID); err == nil {
			add(c.bus[bus], false)
		}
	}
	slices.SortFunc(out, func(a, b Target) int {
		if a.Own != b.Own {
			if a.Own {
				return -1
			}
			return 1
		}
		return cmp.Or(strings.Compare(a.Pool, b.Pool), strings.Compare(a.Device, b.Device))
	})
	return out
}

// Known reports whether dev is a device of the node and driver in the catalog.
func (c *Catalog) Known(dev DeviceID) bool { return c.known[dev] }

// Assignment is the health that applies to one DRA device.
type Assignment struct {
	Status health.DeviceStatus
	// Own tells whether Status is the device's own (see Target).
	Own bool
}

// Assign returns, for every DRA device that a device of snap that is not Healthy applies to,
// the worst such status: the higher severity, then eviction, then the device's own status, then
// the first in snapshot order. It also returns the devices that are not Healthy and reach no
// DRA device, leaving out a MIG device whose parent GPU reaches some and is as sick (the
// parent's rules already cover it).
func (c *Catalog) Assign(snap health.Snapshot) (map[DeviceID]Assignment, []health.DeviceStatus) {
	out := map[DeviceID]Assignment{}
	reaches := map[string]health.DeviceStatus{} // GPUs (lower-case UUID) that reach a device
	var unmatched []health.DeviceStatus
	for _, d := range snap.Devices {
		if d.Health == health.Healthy {
			continue
		}
		targets := c.Targets(d.Device)
		if len(targets) == 0 {
			if !coveredByParent(d, reaches) {
				unmatched = append(unmatched, d)
			}
			continue
		}
		if d.Device.MIG == nil {
			reaches[strings.ToLower(d.Device.UUID)] = d
		}
		for _, t := range targets {
			cur, ok := out[t.DeviceID]
			if !ok || rank(d) > rank(cur.Status) || (rank(d) == rank(cur.Status) && t.Own && !cur.Own) {
				out[t.DeviceID] = Assignment{Status: d, Own: t.Own}
			}
		}
	}
	return out, unmatched
}

// coveredByParent: snapshots list each GPU before its MIG devices, so the parent is seen first.
func coveredByParent(d health.DeviceStatus, reaches map[string]health.DeviceStatus) bool {
	if d.Device.MIG == nil {
		return false
	}
	p, ok := reaches[strings.ToLower(d.Device.MIG.ParentUUID)]
	return ok && rank(p) >= rank(d)
}

func rank(d health.DeviceStatus) int {
	r := 2 * int(d.Health)
	if d.Evict {
		r++
	}
	return r
}
