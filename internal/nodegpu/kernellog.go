package nodegpu

import (
	"context"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// OpenKernelLog opens the node's kernel log beside the NVML backend, as the config's kernelLog
// section says: the device itself (kernelLog.path), or a `gpuhealth kmsg-relay` that reads it
// for a process that may not (kernelLog.relaySocket: the chart's agent and device plugin,
// unprivileged beside a privileged relay container). The simulator reads no kernel log of the
// machine it runs on: its scenarios carry kernel-log lines of their own (kmsg events), which it
// parses itself.
func OpenKernelLog(ctx context.Context, cfg *config.HealthConfig, backend string, devices []health.Device, bootID string) *kmsg.Companion {
	k := cfg.KernelLogSection()
	if backend != "nvml" || k.Enabled == nil || !*k.Enabled {
		return kmsg.NewCompanion()
	}
	return kmsg.OpenCompanion(ctx, kmsg.CompanionOptions{Path: k.Path, RelaySocket: k.RelaySocket, Devices: devices, BootID: bootID})
}
