package deviceplugin

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func gpu(i int, uuid string) health.Device {
	return health.Device{UUID: uuid, Index: i, PCIBusID: "00000000:0" + string(rune('A'+i)) + ":00.0"}
}

func devStatus(d health.Device, h health.Severity) health.DeviceStatus {
	return health.DeviceStatus{Device: d, Health: h}
}

var (
	gpu0 = gpu(0, "GPU-0000")
	gpu1 = gpu(1, "GPU-1111")
	gpu2 = gpu(2, "GPU-2222")
	mig  = health.Device{UUID: "MIG-aaaa", Index: 2, MIG: &health.MIGPlacement{ParentUUID: "GPU-2222", GPUInstance: 1}}
)

func TestHealth(t *testing.T) {
	tests := []struct {
		name string
		in   health.DeviceStatus
		want string
	}{
		{"healthy", devStatus(gpu0, health.Healthy), pluginapi.Healthy},
		{"degraded stays schedulable", devStatus(gpu0, health.Degraded), pluginapi.Healthy},
		{"unhealthy", devStatus(gpu0, health.Unhealthy), pluginapi.Unhealthy},
		{"drained", health.DeviceStatus{Device: gpu0, Health: health.Unhealthy,
			Conditions: []health.Condition{{Type: health.ConditionAdmin, Severity: health.Unhealthy, Reason: health.ReasonAdminDrain}}}, pluginapi.Unhealthy},
		{"unmonitored is not known to be broken", health.DeviceStatus{Device: gpu0, Unmonitored: true}, pluginapi.Healthy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Health(tc.in); got != tc.want {
				t.Errorf("Health = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDevices(t *testing.T) {
	numa := func(d health.Device) (int, bool) { return d.Index % 2, d.Index != 1 }
	tests := []struct {
		name string
		snap []health.DeviceStatus
		opts Options
		want []string // ID=Health[@numa]
	}{
		{
			name: "UUIDs in index order, MIG instances left out",
			snap: []health.DeviceStatus{devStatus(gpu0, health.Healthy), devStatus(gpu1, health.Unhealthy), devStatus(gpu2, health.Degraded), devStatus(mig, health.Degraded)},
			want: []string{"GPU-0000=Healthy", "GPU-1111=Unhealthy", "GPU-2222=Healthy"},
		},
		{
			name: "a missing GPU shifts nothing",
			snap: []health.DeviceStatus{devStatus(gpu0, health.Healthy), devStatus(gpu2, health.Unhealthy)},
			want: []string{"GPU-0000=Healthy", "GPU-2222=Unhealthy"},
		},
		{
			name: "recovery",
			snap: []health.DeviceStatus{devStatus(gpu0, health.Healthy), devStatus(gpu1, health.Healthy)},
			want: []string{"GPU-0000=Healthy", "GPU-1111=Healthy"},
		},
		{
			name: "MIG instances only",
			snap: []health.DeviceStatus{devStatus(gpu2, health.Healthy), devStatus(mig, health.Unhealthy)},
			opts: Options{Select: MIGInstances},
			want: []string{"MIG-aaaa=Unhealthy"},
		},
		{
			name: "topology where known",
			snap: []health.DeviceStatus{devStatus(gpu0, health.Healthy), devStatus(gpu1, health.Healthy), devStatus(gpu2, health.Healthy)},
			opts: Options{NUMANode: numa},
			want: []string{"GPU-0000=Healthy@0", "GPU-1111=Healthy", "GPU-2222=Healthy@0"},
		},
		{
			name: "no devices",
			want: []string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := describe(Devices(health.Snapshot{Devices: tc.snap}, tc.opts))
			if !slices.Equal(got, tc.want) {
				t.Errorf("Devices = %v, want %v", got, tc.want)
			}
		})
	}
}

func describe(devs []*pluginapi.Device) []string {
	out := []string{}
	for _, d := range devs {
		s := d.GetID() + "=" + d.GetHealth()
		for _, n := range d.GetTopology().GetNodes() {
			s += "@" + string(rune('0'+n.GetID()))
		}
		out = append(out, s)
	}
	return out
}

func TestEqual(t *testing.T) {
	dev := func(id, h string, numa ...int64) *pluginapi.Device {
		d := &pluginapi.Device{ID: id, Health: h}
		if len(numa) > 0 {
			d.Topology = &pluginapi.TopologyInfo{}
			for _, n := range numa {
				d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
			}
		}
		return d
	}
	tests := []struct {
		name string
		a, b []*pluginapi.Device
		want bool
	}{
		{"same", []*pluginapi.Device{dev("a", "Healthy", 0)}, []*pluginapi.Device{dev("a", "Healthy", 0)}, true},
		{"health differs", []*pluginapi.Device{dev("a", "Healthy")}, []*pluginapi.Device{dev("a", "Unhealthy")}, false},
		{"topology differs", []*pluginapi.Device{dev("a", "Healthy", 0)}, []*pluginapi.Device{dev("a", "Healthy", 1)}, false},
		{"order differs", []*pluginapi.Device{dev("a", "Healthy"), dev("b", "Healthy")}, []*pluginapi.Device{dev("b", "Healthy"), dev("a", "Healthy")}, false},
		{"length differs", []*pluginapi.Device{dev("a", "Healthy")}, nil, false},
		{"both empty", nil, []*pluginapi.Device{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Equal(tc.a, tc.b); got != tc.want {
				t.Errorf("Equal = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPreferred(t *testing.T) {
	// Eight GPUs, 0-3 on NUMA node 0 and 4-7 on node 1.
	known := map[string]health.DeviceStatus{}
	ids := []string{}
	for i := range 8 {
		id := "GPU-" + string(rune('0'+i))
		ids = append(ids, id)
		known[id] = devStatus(health.Device{UUID: id, Index: i}, health.Healthy)
	}
	setHealth := func(id string, h health.Severity) map[string]health.DeviceStatus {
		m := map[string]health.DeviceStatus{}
		for k, v := range known {
			m[k] = v
		}
		d := m[id]
		d.Health = h
		m[id] = d
		return m
	}
	numa := func(d health.Device) (int, bool) { return d.Index / 4, true }
	tests := []struct {
		name      string
		known     map[string]health.DeviceStatus
		numa      func(health.Device) (int, bool)
		available []string
		must      []string
		size      int
		want      []string
	}{
		{"by index without topology", known, nil, ids, nil, 2, []string{"GPU-0", "GPU-1"}},
		{"healthy before degraded", setHealth("GPU-0", health.Degraded), nil, ids, nil, 2, []string{"GPU-1", "GPU-2"}},
		{"must-include first", known, nil, ids, []string{"GPU-5"}, 2, []string{"GPU-5", "GPU-0"}},
		{"packs onto the must-include's NUMA node", known, numa, ids, []string{"GPU-5"}, 3, []string{"GPU-5", "GPU-4", "GPU-6"}},
		{"smallest NUMA node that fits", known, numa, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-5", "GPU-6"}, nil, 2, []string{"GPU-5", "GPU-6"}},
		{"spills from the biggest node", known, numa, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-5", "GPU-6"}, nil, 4, []string{"GPU-0", "GPU-1", "GPU-2", "GPU-5"}},
		{"unknown IDs last", known, nil, []string{"GPU-x", "GPU-3"}, nil, 2, []string{"GPU-3", "GPU-x"}},
		{"fewer available than asked", known, nil, []string{"GPU-3"}, nil, 2, []string{"GPU-3"}},
		{"must-include only", known, nil, ids, []string{"GPU-2", "GPU-1"}, 2, []string{"GPU-2", "GPU-1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Preferred(tc.known, tc.numa, tc.available, tc.must, tc.size)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Preferred = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSysfsNUMA(t *testing.T) {
	root := t.TempDir()
	write := func(addr, content string) {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("0000:c4:00.0", "1\n")
	write("0000:17:00.0", "-1\n")
	numa := SysfsNUMA(root)
	tests := []struct {
		name   string
		busID  string
		want   int
		wantOK bool
	}{
		{"NVML's eight-digit domain, upper case", "00000000:C4:00.0", 1, true},
		{"no affinity", "00000000:17:00.0", 0, false},
		{"no such device", "00000000:99:00.0", 0, false},
		{"no bus ID", "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, ok := numa(health.Device{PCIBusID: tc.busID})
			if n != tc.want || ok != tc.wantOK {
				t.Errorf("NUMA node = %d, %v; want %d, %v", n, ok, tc.want, tc.wantOK)
			}
		})
	}
}
