package dra_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/dra/dratest"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

const driver = "gpu.nvidia.com"

// The shapes below follow what NVIDIA's DRA driver publishes (docs/dra-devices.md): devices
// named by minor, static MIG devices with uuid and parentUUID, dynamic MIG partitions with
// parentUUID only, VFIO devices with a uuid derived from the PCI address, and the standard
// PCI bus ID attribute on every device of a GPU.
var (
	wholeGPU = func(name, uuid, bus string) resourceapi.Device {
		return dratest.Device(name, dratest.Attrs{"type": dratest.String("gpu"), "uuid": dratest.String(uuid), "resource.kubernetes.io/pciBusID": dratest.String(bus)})
	}
	staticMIG = func(name, uuid, parent, bus string) resourceapi.Device {
		return dratest.Device(name, dratest.Attrs{"type": dratest.String("mig"), "uuid": dratest.String(uuid), "parentUUID": dratest.String(parent), "resource.kubernetes.io/pciBusID": dratest.String(bus)})
	}
	partition = func(name, parent, bus string) resourceapi.Device {
		return dratest.Device(name, dratest.Attrs{"type": dratest.String("mig"), "parentUUID": dratest.String(parent), "profile": dratest.String("1g.10gb"), "resource.kubernetes.io/pciBusID": dratest.String(bus)})
	}
	vfio = func(name, bus string) resourceapi.Device {
		return dratest.Device(name, dratest.Attrs{"type": dratest.String("vfio"), "uuid": dratest.String("5f3c0b1e-pci-derived-" + bus[5:7]), "resource.kubernetes.io/pciBusID": dratest.String(bus)})
	}
	gpuA = health.Device{UUID: "GPU-aaaa", PCIBusID: "00000000:1B:00.0"}
	gpuB = health.Device{UUID: "GPU-bbbb", PCIBusID: "00000000:43:00.0"}
	migA = health.Device{UUID: "MIG-a1", PCIBusID: "00000000:1B:00.0", MIG: &health.MIGPlacement{ParentUUID: "GPU-aaaa", GPUInstance: 1}}
)

func names(ts []dra.Target) []string {
	var out []string
	for _, t := range ts {
		n := t.Pool + "/" + t.Device
		if t.Own {
			n += "(own)"
		}
		out = append(out, n)
	}
	return out
}

func TestTargetsCoverEveryDeviceTheDriverPublishesForAGPU(t *testing.T) {
	gen := func(s *resourceapi.ResourceSlice, g int64) *resourceapi.ResourceSlice {
		s.Spec.Pool.Generation = g
		return s
	}
	for _, tc := range []struct {
		name   string
		slices []*resourceapi.ResourceSlice
		attrs  dra.Attributes
		dev    health.Device
		want   []string
	}{
		{"whole GPU by uuid, named by minor", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0"), wholeGPU("gpu-2", "GPU-bbbb", "0000:43:00.0"))},
			dra.Attributes{}, gpuA, []string{"n1/gpu-5(own)"}},
		{"a GPU fault reaches its static MIG devices, not the other GPU's", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			staticMIG("gpu-5-mig-1g10gb-19-0", "MIG-a1", "GPU-aaaa", "0000:1b:00.0"), staticMIG("gpu-5-mig-3g40gb-9-4", "MIG-a2", "GPU-aaaa", "0000:1b:00.0"),
			staticMIG("gpu-2-mig-7g80gb-0-0", "MIG-b1", "GPU-bbbb", "0000:43:00.0"))},
			dra.Attributes{}, gpuA, []string{"n1/gpu-5-mig-1g10gb-19-0", "n1/gpu-5-mig-3g40gb-9-4"}},
		{"a MIG fault reaches only its own static MIG device", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			staticMIG("gpu-5-mig-1g10gb-19-0", "MIG-a1", "GPU-aaaa", "0000:1b:00.0"), staticMIG("gpu-5-mig-3g40gb-9-4", "MIG-a2", "GPU-aaaa", "0000:1b:00.0"))},
			dra.Attributes{}, migA, []string{"n1/gpu-5-mig-1g10gb-19-0(own)"}},
		{"dynamic MIG in split slices: the full GPU and all its partitions", []*resourceapi.ResourceSlice{
			dratest.Slice("counters", "n1", driver),
			dratest.Slice("gpu-a", "n1", driver, wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0"),
				partition("gpu-5-mig-1g10gb-19-0", "GPU-aaaa", "0000:1b:00.0"), partition("gpu-5-mig-7g80gb-0-0", "GPU-aaaa", "0000:1b:00.0")),
			dratest.Slice("gpu-b", "n1", driver, wholeGPU("gpu-2", "GPU-bbbb", "0000:43:00.0"), partition("gpu-2-mig-1g10gb-19-0", "GPU-bbbb", "0000:43:00.0"))},
			dra.Attributes{}, gpuA, []string{"n1/gpu-5(own)", "n1/gpu-5-mig-1g10gb-19-0", "n1/gpu-5-mig-7g80gb-0-0"}},
		{"dynamic MIG: a live MIG instance is no partition the slices name", []*resourceapi.ResourceSlice{dratest.Slice("gpu-a", "n1", driver,
			wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0"), partition("gpu-5-mig-1g10gb-19-0", "GPU-aaaa", "0000:1b:00.0"))},
			dra.Attributes{}, migA, nil},
		{"passthrough: the VFIO device by PCI address, NVML's form normalized", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0"), vfio("gpu-vfio-0", "0000:1b:00.0"), wholeGPU("gpu-2", "GPU-bbbb", "0000:43:00.0"), vfio("gpu-vfio-1", "0000:43:00.0"))},
			dra.Attributes{}, gpuA, []string{"n1/gpu-5(own)", "n1/gpu-vfio-0"}},
		{"a GPU bound to vfio-pci: only its VFIO device is published", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver, vfio("gpu-vfio-0", "0000:1b:00.0"))},
			dra.Attributes{}, gpuA, []string{"n1/gpu-vfio-0"}},
		{"only the newest generation of a pool counts", []*resourceapi.ResourceSlice{
			gen(dratest.Slice("old", "n1", driver, wholeGPU("gpu-0", "GPU-aaaa", "0000:1b:00.0")), 1),
			gen(dratest.Slice("new", "n1", driver, wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0")), 2)},
			dra.Attributes{}, gpuA, []string{"n1/gpu-5(own)"}},
		{"other nodes and drivers are not ours", []*resourceapi.ResourceSlice{
			dratest.Slice("a", "n2", driver, wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0")),
			dratest.Slice("b", "n1", "other.example.com", wholeGPU("gpu-5", "GPU-aaaa", "0000:1b:00.0"))},
			dra.Attributes{}, gpuA, nil},
		{"configured attribute names", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			dratest.Device("card-0", dratest.Attrs{"gpu.nvidia.com/gpuUUID": dratest.String("GPU-aaaa")}), dratest.Device("slice-0", dratest.Attrs{"owner": dratest.String("GPU-aaaa")}),
			dratest.Device("vf-0", dratest.Attrs{"example.com/bdf": dratest.String("1b:00.0")}))},
			dra.Attributes{UUID: "gpuUUID", ParentUUID: "owner", PCIBusID: "example.com/bdf"}, gpuA,
			[]string{"n1/card-0(own)", "n1/slice-0", "n1/vf-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, problems := dra.NewCatalog(tc.slices, "n1", driver, tc.attrs.WithDefaults())
			if len(problems) > 0 {
				t.Errorf("problems: %v", problems)
			}
			if got := names(c.Targets(tc.dev)); !slices.Equal(got, tc.want) {
				t.Errorf("Targets = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestBadSlicesGiveProblemsNotPanics: what a broken or hostile driver publishes is left out
// and described, and matching carries on with the rest.
func TestBadSlicesGiveProblemsNotPanics(t *testing.T) {
	for _, tc := range []struct {
		name    string
		slices  []*resourceapi.ResourceSlice
		want    []string // one substring per problem, in order
		targets []string // of gpuA
	}{
		{"uuid not a string", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			dratest.Device("gpu-0", dratest.Attrs{"uuid": {IntValue: new(int64)}, "parentUUID": dratest.String("GPU-aaaa")}))},
			[]string{"gpu-0: attribute uuid is not a string"}, []string{"n1/gpu-0"}},
		{"empty values", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver, dratest.Device("gpu-0", dratest.Attrs{"uuid": dratest.String(""), "parentUUID": dratest.String("")}))},
			[]string{"attribute parentUUID is empty", "attribute uuid is empty"}, nil},
		{"malformed PCI address", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver, dratest.Device("gpu-vfio-0", dratest.Attrs{"resource.kubernetes.io/pciBusID": dratest.String("pci-0:zz")}))},
			[]string{"is not a PCI address"}, nil},
		{"bare and qualified names disagree", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			dratest.Device("gpu-0", dratest.Attrs{"uuid": dratest.String("GPU-aaaa"), "gpu.nvidia.com/uuid": dratest.String("GPU-zzzz")}))},
			[]string{"is given twice with different values"}, nil},
		{"no attribute at all", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver, resourceapi.Device{Name: "gpu-0"})},
			[]string{"gpu-0: carries none of uuid, parentUUID and resource.kubernetes.io/pciBusID"}, nil},
		{"a device published twice", []*resourceapi.ResourceSlice{
			dratest.Slice("s1", "n1", driver, wholeGPU("gpu-0", "GPU-aaaa", "0000:1b:00.0")),
			dratest.Slice("s2", "n1", driver, wholeGPU("gpu-0", "GPU-zzzz", "0000:99:00.0"))},
			[]string{"gpu-0: is published more than once"}, []string{"n1/gpu-0(own)"}},
		{"a UUID on two devices: both are tainted", []*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
			wholeGPU("gpu-0", "GPU-aaaa", "0000:1b:00.0"), wholeGPU("gpu-1", "GPU-AAAA", "0000:1c:00.0"))},
			[]string{`value "gpu-aaaa" is on 2 devices (n1/gpu-0, n1/gpu-1)`}, []string{"n1/gpu-0(own)", "n1/gpu-1(own)"}},
		{"a nil slice", []*resourceapi.ResourceSlice{nil, dratest.Slice("s", "n1", driver, wholeGPU("gpu-0", "GPU-aaaa", "0000:1b:00.0"))},
			nil, []string{"n1/gpu-0(own)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, problems := dra.NewCatalog(tc.slices, "n1", driver, dra.DefaultAttributes())
			if len(problems) != len(tc.want) {
				t.Fatalf("problems = %v, want %d", problems, len(tc.want))
			}
			for i, p := range problems {
				if !strings.Contains(p.String(), tc.want[i]) {
					t.Errorf("problem %d = %q, want it to say %q", i, p, tc.want[i])
				}
			}
			if got := names(c.Targets(gpuA)); !slices.Equal(got, tc.targets) {
				t.Errorf("Targets(gpuA) = %v, want %v", got, tc.targets)
			}
		})
	}
}

func TestAssignPicksTheWorstStatusPerDevice(t *testing.T) {
	xid := func(code uint32, sev health.Severity) health.Condition {
		return health.Condition{Type: health.ConditionXID, Code: code, Severity: sev, Reason: fmt.Sprintf("XID%d", code)}
	}
	status := func(d health.Device, h health.Severity, evict bool) health.DeviceStatus {
		return health.DeviceStatus{Device: d, Health: h, Evict: evict, Conditions: []health.Condition{xid(79, h)}}
	}
	migB := health.Device{UUID: "MIG-b1", MIG: &health.MIGPlacement{ParentUUID: "GPU-bbbb", GPUInstance: 1}}
	c, _ := dra.NewCatalog([]*resourceapi.ResourceSlice{dratest.Slice("s", "n1", driver,
		staticMIG("gpu-5-mig-1g10gb-19-0", "MIG-a1", "GPU-aaaa", "0000:1b:00.0"),
		staticMIG("gpu-5-mig-1g10gb-19-1", "MIG-a2", "GPU-aaaa", "0000:1b:00.0"),
		wholeGPU("gpu-2", "GPU-bbbb", "0000:43:00.0"), partition("gpu-2-mig-1g10gb-19-0", "GPU-bbbb", "0000:43:00.0"))},
		"n1", driver, dra.DefaultAttributes())
	type want struct {
		uuid string
		own  bool
	}
	for _, tc := range []struct {
		name      string
		snap      []health.DeviceStatus
		want      map[string]want
		unmatched []string
	}{
		{"a GPU fault: a static MIG device keeps its own, equally sick status", []health.DeviceStatus{
			status(gpuA, health.Unhealthy, true), status(migA, health.Unhealthy, true)},
			map[string]want{"gpu-5-mig-1g10gb-19-0": {"MIG-a1", true}, "gpu-5-mig-1g10gb-19-1": {"GPU-aaaa", false}}, nil},
		{"the worse status wins", []health.DeviceStatus{
			status(gpuA, health.Degraded, false), status(migA, health.Unhealthy, false)},
			map[string]want{"gpu-5-mig-1g10gb-19-0": {"MIG-a1", true}, "gpu-5-mig-1g10gb-19-1": {"GPU-aaaa", false}}, nil},
		{"a dynamic MIG instance whose parent is as sick is covered", []health.DeviceStatus{
			status(gpuB, health.Unhealthy, false), status(migB, health.Unhealthy, false)},
			map[string]want{"gpu-2": {"GPU-bbbb", true}, "gpu-2-mig-1g10gb-19-0": {"GPU-bbbb", false}}, nil},
		{"a fault of a dynamic MIG instance alone has no device", []health.DeviceStatus{
			status(gpuB, health.Healthy, false), status(migB, health.Unhealthy, false)},
			map[string]want{}, []string{"MIG-b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, unmatched := c.Assign(health.Snapshot{Devices: tc.snap})
			if len(got) != len(tc.want) {
				t.Errorf("assigned %d devices, want %d: %v", len(got), len(tc.want), got)
			}
			for name, w := range tc.want {
				a := got[dra.DeviceID{Pool: "n1", Device: name}]
				if a.Status.Device.UUID != w.uuid || a.Own != w.own {
					t.Errorf("%s: got %s own=%v, want %s own=%v", name, a.Status.Device.UUID, a.Own, w.uuid, w.own)
				}
			}
			var um []string
			for _, d := range unmatched {
				um = append(um, d.Device.UUID)
			}
			if !slices.Equal(um, tc.unmatched) {
				t.Errorf("unmatched = %v, want %v", um, tc.unmatched)
			}
		})
	}
}
