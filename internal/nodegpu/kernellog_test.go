package nodegpu

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestOpenKernelLogAsTheConfigSays: the kernel log is read only beside NVML and only when the
// config leaves it on, from the device or from a kmsg relay as the config says; the simulator
// and a config that turns it off open nothing, even where the log can be read.
func TestOpenKernelLogAsTheConfigSays(t *testing.T) {
	readable := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(readable, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "nk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := filepath.Join(dir, "relay.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- kmsg.NewRelay(kmsg.RelayOptions{BootID: "boot"}).Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()

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
		{name: "nvml, from a relay", backend: "nvml", section: config.KernelLogConfig{RelaySocket: socket}, wantUp: true},
		{name: "nvml, off, relay there", backend: "nvml", section: config.KernelLogConfig{Enabled: &off, RelaySocket: socket}},
		{name: "sim reads no kernel log of its machine", backend: "sim", section: config.KernelLogConfig{Enabled: &on, Path: readable}},
		{name: "nor from a relay", backend: "sim", section: config.KernelLogConfig{RelaySocket: socket}},
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
