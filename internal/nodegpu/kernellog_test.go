package nodegpu

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestOpenKernelLogAsTheConfigSays: the kernel log is read only beside NVML and only when the
// config leaves it on; the simulator and a config that turns it off open nothing, even where
// the path can be read.
func TestOpenKernelLogAsTheConfigSays(t *testing.T) {
	readable := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(readable, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	on, off := true, false
	for _, tc := range []struct {
		name    string
		backend string
		section config.KernelLogConfig
		wantUp  bool
	}{
		{name: "nvml, on, readable", backend: "nvml", section: config.KernelLogConfig{Enabled: &on, Path: readable}, wantUp: true},
		{name: "nvml, unset means on", backend: "nvml", section: config.KernelLogConfig{Path: readable}, wantUp: true},
		{name: "nvml, off", backend: "nvml", section: config.KernelLogConfig{Enabled: &off, Path: readable}},
		{name: "nvml, on, unreadable: a warning, no source", backend: "nvml", section: config.KernelLogConfig{Enabled: &on, Path: "/nonexistent/kmsg"}},
		{name: "sim reads no kernel log of its machine", backend: "sim", section: config.KernelLogConfig{Enabled: &on, Path: readable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.HealthConfig{KernelLog: tc.section}
			k := OpenKernelLog(context.Background(), cfg, tc.backend, nil, "boot")
			defer func() { _ = k.Close() }()
			if k.Up() != tc.wantUp {
				t.Errorf("Up() = %v, want %v", k.Up(), tc.wantUp)
			}
		})
	}
}
