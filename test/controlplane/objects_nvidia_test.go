package controlplane

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// TestNVIDIAFixturesKeepTheAPILimits checks the fixtures against the ResourceSlice limits the API
// server enforces, so a shape error shows here and not as a rejected create in an e2e test.
func TestNVIDIAFixturesKeepTheAPILimits(t *testing.T) {
	gpus := HGXH100("node-a")
	gpus[2].MIG = []NVIDIAMIGDevice{{UUID: "MIG-1", Profile: "3g.40gb", PlacementStart: 0}, {UUID: "MIG-2", Profile: "3g.40gb", PlacementStart: 4}}
	plain, err := NVIDIAResourceSlice("node-a", gpus...)
	if err != nil {
		t.Fatal(err)
	}
	passthrough, err := NVIDIAPassthroughResourceSlice("node-a", gpus...)
	if err != nil {
		t.Fatal(err)
	}
	dynamic := NVIDIADynamicMIGResourceSlices("node-a", HGXH100("node-a")...)
	for _, tc := range []struct {
		name    string
		slices  []*resourcev1.ResourceSlice
		devices int
	}{
		{"default mode", []*resourcev1.ResourceSlice{plain}, 7 + 2},
		{"passthrough", []*resourcev1.ResourceSlice{passthrough}, 7 + 2 + 7},
		{"dynamic MIG", dynamic, 8 * (1 + 7 + 4 + 3 + 2 + 1 + 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			for _, s := range tc.slices {
				n += len(s.Spec.Devices)
				checkSlice(t, s)
				if s.Spec.Pool.ResourceSliceCount != int64(len(tc.slices)) {
					t.Errorf("%s: resourceSliceCount %d, want %d", s.Name, s.Spec.Pool.ResourceSliceCount, len(tc.slices))
				}
			}
			if n != tc.devices {
				t.Errorf("%d devices, want %d", n, tc.devices)
			}
		})
	}
}

func checkSlice(t *testing.T, s *resourcev1.ResourceSlice) {
	t.Helper()
	if len(s.Spec.Devices) > 0 && len(s.Spec.SharedCounters) > 0 {
		t.Errorf("%s: devices and shared counters in one slice", s.Name)
	}
	if len(s.Spec.SharedCounters) > resourcev1.ResourceSliceMaxCounterSets {
		t.Errorf("%s: %d counter sets", s.Name, len(s.Spec.SharedCounters))
	}
	for _, cs := range s.Spec.SharedCounters {
		if len(cs.Counters) > resourcev1.ResourceSliceMaxCountersPerCounterSet {
			t.Errorf("%s: counter set %s has %d counters", s.Name, cs.Name, len(cs.Counters))
		}
	}
	if len(s.Spec.Devices) > resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures {
		t.Errorf("%s: %d devices", s.Name, len(s.Spec.Devices))
	}
	seen := map[string]bool{}
	for _, d := range s.Spec.Devices {
		if msgs := validation.IsDNS1123Label(d.Name); len(msgs) > 0 || seen[d.Name] {
			t.Errorf("%s: device name %q: %v (or repeated)", s.Name, d.Name, msgs)
		}
		seen[d.Name] = true
		if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			t.Errorf("%s: %d attributes and capacities", d.Name, n)
		}
		if _, ok := d.Attributes["index"]; ok {
			t.Errorf("%s: the driver no longer publishes index", d.Name)
		}
		for _, c := range d.ConsumesCounters {
			if len(c.Counters) > resourcev1.ResourceSliceMaxCountersPerDeviceCounterConsumption {
				t.Errorf("%s: consumes %d counters", d.Name, len(c.Counters))
			}
		}
	}
}

func TestNVIDIADeviceNames(t *testing.T) {
	p, _ := H100MIGProfile("1g.10gb")
	if got := NVIDIAMIGDeviceName(1, p, 0); got != "gpu-1-mig-1g10gb-19-0" {
		t.Errorf("NVIDIAMIGDeviceName = %q", got)
	}
	gpus := HGXH100("node-a")
	minorIsIndex := 0
	for i, g := range gpus {
		if g.Minor == i {
			minorIsIndex++
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || len(g.UUID) != len("GPU-76f99748-0f9a-e5e5-c69b-1e46cae6e125") {
			t.Errorf("GPU %d: UUID %q is not shaped like NVML's", i, g.UUID)
		}
	}
	if minorIsIndex == len(gpus) {
		t.Error("every minor equals its index; the fixture should tell them apart")
	}
	s, err := NVIDIAPassthroughResourceSlice("node-a", gpus[3], gpus[0])
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]resourcev1.Device{}
	for _, d := range s.Spec.Devices {
		byName[d.Name] = d
	}
	// gpus[0] has the lower PCI address: it is gpu-vfio-0, whatever order it was given in.
	vfio0 := byName[NVIDIAVFIODeviceName(0)]
	if got := *vfio0.Attributes["resource.kubernetes.io/pciBusID"].StringValue; got != gpus[0].PCIBusID {
		t.Errorf("gpu-vfio-0 is at %s, want %s", got, gpus[0].PCIBusID)
	}
	if got := *vfio0.Attributes["uuid"].StringValue; got != NVIDIAVFIOUUID("00000000:18:00.0") || got == gpus[0].UUID {
		t.Errorf("gpu-vfio-0 uuid %s, want the one derived from its PCI address", got)
	}
	if _, ok := byName[NVIDIAGPUDeviceName(gpus[3].Minor)]; !ok {
		t.Errorf("no device %s: %v", NVIDIAGPUDeviceName(gpus[3].Minor), s.Spec.Devices)
	}
}
