package nvml

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// SetResetRunner makes a CommandResetter run its command through run instead of executing it,
// so that tests see what NVML looks like while the command runs.
func SetResetRunner(r gpuapi.Resetter, run func(ctx context.Context, argv []string) ([]byte, error)) {
	r.(*commandResetter).run = run
}

// ParkedLoops returns how many of Run's loops wait while a reset has NVML.
func ParkedLoops(b *Backend) int { return b.gate.parkedLoops() }

// WithFabricInfoV answers the versioned fabric call (nvmlDeviceGetGpuFabricInfoV with a struct of
// the version asked) with call: go-nvml's mock cannot, as the call's handler holds go-nvml's own C
// handle.
func WithFabricInfoV(call func(h nvml.Device, version int) (nvml.GpuFabricInfo_v3, nvml.Return)) Option {
	return func(o *options) {
		o.fabricInfoV = func(h nvml.Device, version int) (nvml.GpuFabricInfo_v3, nvml.Return, bool) {
			info, ret := call(h, version)
			return info, ret, true
		}
	}
}
