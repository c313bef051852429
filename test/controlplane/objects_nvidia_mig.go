package controlplane

import (
	"fmt"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// MIGProfile is a GPU instance profile as NVML describes it and NVIDIA's DRA driver publishes it.
type MIGProfile struct {
	// Name is the profile as nvidia-smi and the driver's profile attribute write it ("1g.10gb").
	Name string
	// ID is NVML's GPU instance profile ID (nvidia-smi mig -lgip), part of the device name.
	ID int
	// Slices is how many memory slices an instance takes; Starts are its possible placements.
	Slices int
	Starts []int
	// Capacities of one instance.
	Multiprocessors, CopyEngines, Decoders, Encoders, JPEGEngines, OFAEngines int64
	MemoryMiB                                                                 int64
}

// H100MemorySlices is how many memory slices an H100 80GB has.
const H100MemorySlices = 8

// H100MIGProfiles returns the MIG profiles of an H100 80GB HBM3 (the +me variants left out),
// with their placements. Capacities are close to what NVML reports; exact values do not matter
// to a scheduler as long as they add up.
func H100MIGProfiles() []MIGProfile {
	return []MIGProfile{
		{Name: "1g.10gb", ID: 19, Slices: 1, Starts: []int{0, 1, 2, 3, 4, 5, 6}, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGEngines: 1, MemoryMiB: 9856},
		{Name: "1g.20gb", ID: 15, Slices: 2, Starts: []int{0, 2, 4, 6}, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGEngines: 1, MemoryMiB: 19968},
		{Name: "2g.20gb", ID: 14, Slices: 2, Starts: []int{0, 2, 4}, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGEngines: 2, MemoryMiB: 19968},
		{Name: "3g.40gb", ID: 9, Slices: 4, Starts: []int{0, 4}, Multiprocessors: 60, CopyEngines: 3, Decoders: 3, JPEGEngines: 3, MemoryMiB: 40192},
		{Name: "4g.40gb", ID: 5, Slices: 4, Starts: []int{0}, Multiprocessors: 64, CopyEngines: 4, Decoders: 4, JPEGEngines: 4, MemoryMiB: 40192},
		{Name: "7g.80gb", ID: 0, Slices: 8, Starts: []int{0}, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGEngines: 7, OFAEngines: 1, MemoryMiB: 80384},
	}
}

// H100MIGProfile returns the H100 profile called name ("1g.10gb"), or false.
func H100MIGProfile(name string) (MIGProfile, bool) {
	for _, p := range H100MIGProfiles() {
		if p.Name == name {
			return p, true
		}
	}
	return MIGProfile{}, false
}

// NVIDIAMIGDeviceName is the name NVIDIA's DRA driver gives a MIG device, static or dynamic:
// gpu-<parent minor>-mig-<profile without dots>-<profile ID>-<placement start>, for example
// gpu-1-mig-1g10gb-19-0.
func NVIDIAMIGDeviceName(parentMinor int, p MIGProfile, start int) string {
	name := strings.NewReplacer(".", "", "+", "-").Replace(strings.ToLower(p.Name))
	return fmt.Sprintf("gpu-%d-mig-%s-%d-%d", parentMinor, name, p.ID, start)
}

// migCapacities are a MIG device's capacities; the driver names counters after them in
// kebab case.
func (p MIGProfile) capacities() map[resourcev1.QualifiedName]resourcev1.DeviceCapacity {
	return map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
		"multiprocessors": quantity(p.Multiprocessors),
		"copyEngines":     quantity(p.CopyEngines),
		"decoders":        quantity(p.Decoders),
		"encoders":        quantity(p.Encoders),
		"jpegEngines":     quantity(p.JPEGEngines),
		"ofaEngines":      quantity(p.OFAEngines),
		"memory":          quantity(p.MemoryMiB << 20),
	}
}

// counters is what an instance at start consumes of its GPU's counter set.
func (p MIGProfile) counters(start int) map[string]resourcev1.Counter {
	out := map[string]resourcev1.Counter{
		"multiprocessors": {Value: *resource.NewQuantity(p.Multiprocessors, resource.BinarySI)},
		"copy-engines":    {Value: *resource.NewQuantity(p.CopyEngines, resource.BinarySI)},
		"decoders":        {Value: *resource.NewQuantity(p.Decoders, resource.BinarySI)},
		"encoders":        {Value: *resource.NewQuantity(p.Encoders, resource.BinarySI)},
		"jpeg-engines":    {Value: *resource.NewQuantity(p.JPEGEngines, resource.BinarySI)},
		"ofa-engines":     {Value: *resource.NewQuantity(p.OFAEngines, resource.BinarySI)},
		"memory":          {Value: *resource.NewQuantity(p.MemoryMiB<<20, resource.BinarySI)},
	}
	for i := start; i < start+p.Slices; i++ {
		out[fmt.Sprintf("memory-slice-%d", i)] = resourcev1.Counter{Value: *resource.NewQuantity(1, resource.BinarySI)}
	}
	return out
}

func quantity(v int64) resourcev1.DeviceCapacity {
	return resourcev1.DeviceCapacity{Value: *resource.NewQuantity(v, resource.BinarySI)}
}

// counterSetName is the driver's name for the counter set of the GPU with this minor.
func counterSetName(minor int) string { return fmt.Sprintf("gpu-%d-counter-set", minor) }

// migAttributes are the attributes every MIG device of gpu carries (the driver's
// CommonAttributesMig): no uuid, which only a static MIG device adds.
func (g NVIDIAGPU) migAttributes(p MIGProfile) map[resourcev1.QualifiedName]resourcev1.DeviceAttribute {
	a := g.commonAttributes()
	a["type"] = str("mig")
	a["parentUUID"] = str(g.UUID)
	a["profile"] = str(p.Name)
	return a
}

// staticMIGDevice is a static MIG device: the common attributes, its own uuid, and one
// memorySliceN capacity per memory slice it holds.
func (g NVIDIAGPU) staticMIGDevice(m NVIDIAMIGDevice) (resourcev1.Device, error) {
	p, ok := H100MIGProfile(m.Profile)
	if !ok {
		return resourcev1.Device{}, fmt.Errorf("GPU %s: unknown MIG profile %q", g.UUID, m.Profile)
	}
	attrs := g.migAttributes(p)
	attrs["uuid"] = str(m.UUID)
	caps := p.capacities()
	for i := m.PlacementStart; i < m.PlacementStart+p.Slices; i++ {
		caps[resourcev1.QualifiedName(fmt.Sprintf("memorySlice%d", i))] = quantity(1)
	}
	return resourcev1.Device{Name: NVIDIAMIGDeviceName(g.Minor, p, m.PlacementStart), Attributes: attrs, Capacity: caps}, nil
}

// dynamicMIGDevices are the GPU's full device and every partition the driver announces with
// DynamicMIG on, each consuming from the GPU's counter set.
func (g NVIDIAGPU) dynamicMIGDevices() []resourcev1.Device {
	profiles := H100MIGProfiles()
	full := profiles[len(profiles)-1]
	gpu := g.wholeDevice()
	gpu.Capacity = full.capacities()
	gpu.ConsumesCounters = []resourcev1.DeviceCounterConsumption{{CounterSet: counterSetName(g.Minor), Counters: full.counters(0)}}
	devices := []resourcev1.Device{gpu}
	for _, p := range profiles {
		for _, start := range p.Starts {
			devices = append(devices, resourcev1.Device{
				Name:             NVIDIAMIGDeviceName(g.Minor, p, start),
				Attributes:       g.migAttributes(p),
				Capacity:         p.capacities(),
				ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: counterSetName(g.Minor), Counters: p.counters(start)}},
			})
		}
	}
	return devices
}

// counterSet is the GPU's shared counters: the full GPU's capacities and one counter per
// memory slice.
func (g NVIDIAGPU) counterSet() resourcev1.CounterSet {
	profiles := H100MIGProfiles()
	return resourcev1.CounterSet{Name: counterSetName(g.Minor), Counters: profiles[len(profiles)-1].counters(0)}
}
