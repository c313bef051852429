package nvml

import (
	"context"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// SetResetRunner makes a CommandResetter run its command through run instead of executing it,
// so that tests see what NVML looks like while the command runs.
func SetResetRunner(r gpuapi.Resetter, run func(ctx context.Context, argv []string) ([]byte, error)) {
	r.(*commandResetter).run = run
}

// ParkedLoops returns how many of Run's loops wait while a reset has NVML.
func ParkedLoops(b *Backend) int { return b.gate.parkedLoops() }
