package cli

import (
	"context"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// openKernelLog opens the node's kernel log beside the NVML backend, as the config's kernelLog
// section says. The simulator reads no kernel log of the machine it runs on: its scenarios
// carry kernel-log lines of their own (kmsg events), which it parses itself.
func openKernelLog(ctx context.Context, cfg *config.HealthConfig, backend string, devices []health.Device, bootID string) *agent.KernelLog {
	k := cfg.KernelLogSection()
	if backend != "nvml" {
		off := false
		k.Enabled = &off
	}
	return agent.OpenKernelLog(ctx, k, devices, bootID)
}
