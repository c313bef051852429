package nvml

import (
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoDriver is wrapped by Open's error when the NVML library cannot be loaded or the driver is
// not running: the machine has no usable NVIDIA driver.
var ErrNoDriver = errors.New("NVML library not found: is the NVIDIA driver installed?")

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
		return fmt.Errorf("%w (%w)", ErrNoDriver, ret)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%w: the NVIDIA kernel driver is not loaded (%w)", ErrNoDriver, ret)
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

// lost reports whether ret means the GPU is gone.
func lost(ret nvml.Return) bool { return ret == nvml.ERROR_GPU_IS_LOST }
