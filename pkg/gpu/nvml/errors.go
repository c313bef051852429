package nvml

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// ErrNoDriver is wrapped by Open's error when the machine has no usable NVIDIA driver: the NVML
// library is not there, cannot be loaded, or the kernel driver is not running. The error is then
// a *DriverError that says which.
var ErrNoDriver = errors.New("no usable NVIDIA driver")

// ErrGPULost is wrapped by the Skipped error of a GPU that NVML lists but that was lost (or
// needed a reset, or failed with an unknown error) before it could be identified: a broken GPU
// whose UUID is unknown, which therefore cannot be tracked or marked Unhealthy.
var ErrGPULost = errors.New("GPU lost before it could be identified")

// nvmlError turns an NVML return code into an error that wraps it; SUCCESS is nil.
func nvmlError(op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return fmt.Errorf("%s: %w", op, ret)
}

// initError explains why nvml.Init failed in the words an operator needs.
func initError(ret nvml.Return) error {
	switch ret {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return &DriverError{Kind: ErrLibraryNotFound, Err: ret}
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return &DriverError{Kind: ErrDriverNotLoaded, Err: ret}
	case nvml.ERROR_NO_PERMISSION:
		return fmt.Errorf("initialising NVML: no permission to access the GPUs (%w)", ret)
	default:
		return nvmlError("initialising NVML", ret)
	}
}

// notSupported reports whether ret means "the GPU cannot tell": no data, never a fault.
func notSupported(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// faultOf returns the signal for an answer that says the GPU itself is broken, whatever was
// asked: lost (SignalLost), or in need of a reset before it can be used again
// (SignalResetRequired). Any other answer is no fault.
func faultOf(ret nvml.Return) (health.SignalKind, bool) {
	switch ret {
	case nvml.ERROR_GPU_IS_LOST:
		return health.SignalLost, true
	case nvml.ERROR_RESET_REQUIRED:
		return health.SignalResetRequired, true
	}
	return 0, false
}

// isFault reports whether ret says the GPU is lost or needs a reset.
func isFault(ret nvml.Return) bool {
	_, ok := faultOf(ret)
	return ok
}

// unidentifiable reports whether a failure to get a GPU's handle or UUID means the GPU is broken
// (NVIDIA's device plugin marks such a GPU unhealthy) rather than, say, forbidden to us.
func unidentifiable(ret nvml.Return) bool {
	return isFault(ret) || ret == nvml.ERROR_UNKNOWN
}
