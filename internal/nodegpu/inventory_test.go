package nodegpu

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestMissingGPUsComparesWhatTheConfigurationSays(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	for _, addr := range []string{"0000:10:00.0", "0000:11:00.0"} {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"vendor": "0x10de", "class": "0x030200"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
		}
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
			var got []string
			for _, d := range MissingGPUs(ctx, tc.inv, tc.backend, staticBackend(devs)) {
				got = append(got, d.UUID)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("MissingGPUs = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("MissingGPUs = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

type staticBackend []health.Device

func (b staticBackend) Devices() []health.Device { return b }
