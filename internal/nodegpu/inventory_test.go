package nodegpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/pci"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// busGPU writes an NVIDIA GPU's attributes at addr under root, bound to driver ("": unbound),
// and returns its directory.
func busGPU(t *testing.T, root, addr, driver string) string {
	t.Helper()
	dir := filepath.Join(root, "bus", "pci", "devices", addr)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"vendor": "0x10de", "class": "0x030200"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if driver != "" {
		if err := os.Symlink("../../../../bus/pci/drivers/"+driver, filepath.Join(dir, "driver")); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func uuids(devs []health.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.UUID)
	}
	return out
}

func TestMissingGPUsComparesWhatTheConfigurationSays(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	for _, addr := range []string{"0000:10:00.0", "0000:11:00.0"} {
		busGPU(t, root, addr, "")
	}
	devs := []health.Device{{UUID: "GPU-a", PCIBusID: "00000000:10:00.0"}}
	off := false
	for _, tc := range []struct {
		name    string
		inv     config.InventoryConfig
		backend string
		want    []string
	}{
		{"the simulator reads no sysfs unless told", config.InventoryConfig{}, "sim", nil},
		{"the simulator with a sysfs root", config.InventoryConfig{SysfsRoot: root}, "sim", []string{"MISSING-0000:11:00.0"}},
		{"an expected count beyond the bus", config.InventoryConfig{SysfsRoot: root, ExpectedGPUs: 3}, "sim", []string{"MISSING-0000:11:00.0", "MISSING-2"}},
		{"an unreadable sysfs: the expected count alone", config.InventoryConfig{SysfsRoot: filepath.Join(root, "none"), ExpectedGPUs: 2}, "nvml", []string{"MISSING-1"}},
		{"off", config.InventoryConfig{Enabled: &off, SysfsRoot: root}, "nvml", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := MissingGPUs(ctx, tc.inv, tc.backend, staticBackend(devs))
			if !slices.Equal(uuids(got), tc.want) {
				t.Fatalf("MissingGPUs = %v, want %v", uuids(got), tc.want)
			}
		})
	}
}

// capture is a context whose logger appends each line to lines.
func capture(lines *[]string) context.Context {
	return klog.NewContext(context.Background(), funcr.New(func(prefix, args string) {
		*lines = append(*lines, prefix+" "+args)
	}, funcr.Options{}))
}

// logged counts the lines that hold every one of words.
func logged(lines []string, words ...string) int {
	n := 0
	for _, l := range lines {
		if !slices.ContainsFunc(words, func(w string) bool { return !strings.Contains(l, w) }) {
			n++
		}
	}
	return n
}

// TestMissingGPUsLeavesOutGPUsBoundToAnotherDriver: a GPU bound to vfio-pci on purpose
// (KubeVirt, Kata passthrough) became an Unhealthy MISSING- GPU, and the node's GPUUnhealthy
// condition True.
func TestMissingGPUsLeavesOutGPUsBoundToAnotherDriver(t *testing.T) {
	root := t.TempDir()
	busGPU(t, root, "0000:10:00.0", "nvidia")   // opened
	busGPU(t, root, "0000:11:00.0", "vfio-pci") // given to a virtual machine
	busGPU(t, root, "0000:12:00.0", "")         // NVIDIA's driver failed to bind it
	busGPU(t, root, "0000:13:00.0", "nouveau")
	fifo := busGPU(t, root, "0000:14:00.0", "")
	if err := os.Remove(filepath.Join(fifo, "vendor")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(fifo, "vendor"), 0o644); err != nil {
		t.Fatal(err)
	}
	devs := staticBackend{{UUID: "GPU-a", PCIBusID: "00000000:10:00.0"}}
	for _, tc := range []struct {
		name        string
		inv         config.InventoryConfig
		wantMissing []string
		wantLeftOut []string
	}{
		{
			name:        "left out by default",
			inv:         config.InventoryConfig{SysfsRoot: root},
			wantMissing: []string{"MISSING-0000:12:00.0"},
			wantLeftOut: []string{"0000:11:00.0 (vfio-pci)", "0000:13:00.0 (nouveau)"},
		},
		{
			name:        "left out, and counted among the GPUs an expected count wants",
			inv:         config.InventoryConfig{SysfsRoot: root, ExpectedGPUs: 4},
			wantMissing: []string{"MISSING-0000:12:00.0"},
			wantLeftOut: []string{"0000:11:00.0 (vfio-pci)", "0000:13:00.0 (nouveau)"},
		},
		{
			name:        "counted missing when configured so",
			inv:         config.InventoryConfig{SysfsRoot: root, OtherDrivers: config.OtherDriversMissing},
			wantMissing: []string{"MISSING-0000:11:00.0", "MISSING-0000:12:00.0", "MISSING-0000:13:00.0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var lines []string
			missing, leftOut := MissingGPUs(capture(&lines), tc.inv, "nvml", devs)
			if !slices.Equal(uuids(missing), tc.wantMissing) {
				t.Errorf("missing %v, want %v", uuids(missing), tc.wantMissing)
			}
			var got []string
			for _, f := range leftOut {
				got = append(got, f.Address+" ("+f.Driver+")")
			}
			if !slices.Equal(got, tc.wantLeftOut) {
				t.Errorf("left out %v, want %v", got, tc.wantLeftOut)
			}
			if n := logged(lines, "bound to another driver", "0000:11:00.0 (vfio-pci), 0000:13:00.0 (nouveau)"); n != min(len(tc.wantLeftOut), 1) {
				t.Errorf("%d log lines name the GPUs left out, want %d:\n%s", n, min(len(tc.wantLeftOut), 1), strings.Join(lines, "\n"))
			}
			if n := logged(lines, "skipped", "0000:14:00.0: vendor: a FIFO, not a regular file"); n != 1 {
				t.Errorf("%d log lines name the FIFO, want 1:\n%s", n, strings.Join(lines, "\n"))
			}
		})
	}
}

// TestMissingGPUsOfAHostileBusAreCapped: 4,096 fake NVIDIA functions in sysfs made 4,096
// MISSING- GPUs.
func TestMissingGPUsOfAHostileBusAreCapped(t *testing.T) {
	root := t.TempDir()
	for i := range 4096 {
		busGPU(t, root, fmt.Sprintf("0000:%02x:%02x.%d", i>>8, (i>>3)&0x1f, i&7), "")
	}
	var lines []string
	missing, _ := MissingGPUs(capture(&lines), config.InventoryConfig{SysfsRoot: root}, "nvml", staticBackend{{UUID: "GPU-a", PCIBusID: "00000000:00:00.0"}})
	if len(missing) != health.MaxGPUs-1 {
		t.Errorf("%d placeholders, want %d: the opened GPU and they make MaxGPUs", len(missing), health.MaxGPUs-1)
	}
	if logged(lines, "more NVIDIA GPUs than a node holds", `"onBus"=4096`) != 1 {
		t.Errorf("the cap was not logged:\n%s", strings.Join(lines[:min(len(lines), 5)], "\n"))
	}
}

func TestLeftOutMessageFitsAnEvent(t *testing.T) {
	fns := make([]pci.Function, 4096)
	for i := range fns {
		fns[i] = pci.Function{Address: fmt.Sprintf("0000:%02x:%02x.%d", i>>8, (i>>3)&0x1f, i&7), Driver: strings.Repeat("d", 64)}
	}
	msg := LeftOutMessage(fns)
	if len(msg) > 1024 {
		t.Errorf("the message of 4,096 GPUs left out is %d bytes, more than an Event's note holds:\n%s", len(msg), msg)
	}
	if !strings.HasSuffix(msg, " and 4088 more") || !strings.Contains(msg, "0000:00:00.0 ("+strings.Repeat("d", 64)+")") {
		t.Errorf("message %q", msg)
	}
	one := LeftOutMessage([]pci.Function{{Address: "0000:3b:00.0", Driver: "vfio-pci"}})
	if want := "GPUs bound to another driver are left out of the inventory, neither watched nor counted missing (inventory.otherDrivers: leaveOut): 0000:3b:00.0 (vfio-pci)"; one != want {
		t.Errorf("message %q, want %q", one, want)
	}
}

type staticBackend []health.Device

func (b staticBackend) Devices() []health.Device { return b }
