package nvml

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// The NVIDIA driver can go away under a running backend: the GPU operator's driver container is
// restarted or upgraded, or someone reloads the kernel module. NVML then answers
// ERROR_DRIVER_NOT_LOADED, ERROR_LIB_RM_VERSION_MISMATCH (the kernel module that came back is
// another version than the library this process loaded) or ERROR_UNINITIALIZED (the session
// died with the driver). No call can succeed again in this process: the library it loaded is
// bound for good (the dynamic loader keeps libnvidia-ml mapped once a call was bound to it, and
// answers a later load of the same name with it), so a driver of another version can only be
// met by a fresh process. Run then marks every GPU unmonitored (health kept: the driver going
// away is no news about the GPUs), frees its event set and returns a *DriverGoneError; the
// caller closes the backend (which shuts NVML down) and opens NVML again in a new process (the
// agent and the device plugin re-execute themselves).
//
// Every sampling round starts by asking the driver its version, so that a driver that went away
// is noticed within a sample period even when no reading of a GPU would say so; the event loop
// notices it from EventSet.Wait, and the keeper from nvmlInit when NVML is down after a reset.

// ErrDriverGone is wrapped by the error Run returns when the NVIDIA driver went away under it.
var ErrDriverGone = errDriverGone{}

type errDriverGone struct{}

func (errDriverGone) Error() string { return "the NVIDIA driver went away under NVML" }

// DriverGoneError says what answered that the driver went away, and when.
type DriverGoneError struct {
	// Op is what the backend was doing.
	Op string
	// Ret is NVML's answer.
	Ret nvml.Return
	// At is when it answered.
	At time.Time
}

// Error implements error.
func (e *DriverGoneError) Error() string {
	return fmt.Sprintf("%s: %s: NVML answered %s (%s): the driver was unloaded, upgraded or restarted", ErrDriverGone, e.Op, e.Ret.Error(), retName(e.Ret))
}

// Unwrap lets errors.Is find ErrDriverGone and the nvml.Return.
func (e *DriverGoneError) Unwrap() []error { return []error{ErrDriverGone, e.Ret} }

// driverGone reports whether ret says the driver under this process's NVML session is gone.
func driverGone(ret nvml.Return) bool {
	switch ret {
	case nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_LIB_RM_VERSION_MISMATCH, nvml.ERROR_UNINITIALIZED:
		return true
	}
	return false
}

func retName(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "ERROR_DRIVER_NOT_LOADED"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "ERROR_LIB_RM_VERSION_MISMATCH"
	case nvml.ERROR_UNINITIALIZED:
		return "ERROR_UNINITIALIZED"
	}
	return fmt.Sprintf("code %d", int32(ret))
}

// checkDriver asks the driver its version, as the first call of a sampling round. It returns a
// *DriverGoneError when the answer says the driver is gone.
func (b *Backend) checkDriver() *DriverGoneError {
	_, ret := b.lib.SystemGetDriverVersion()
	if driverGone(ret) {
		return &DriverGoneError{Op: "asking the driver its version", Ret: ret, At: b.opts.clock.Now()}
	}
	return nil
}

// driverWentAway ends Run after a loop saw the driver go: every GPU is unmonitored from now on
// (its health as it was). The first report wins; later ones (the other loop seeing the same)
// return the same error.
func (b *Backend) driverWentAway(gone *DriverGoneError, sink gpuapi.Sink) error {
	if !b.gone.CompareAndSwap(nil, gone) {
		return b.gone.Load()
	}
	b.log.Error(gone, "The NVIDIA driver went away: every GPU is unmonitored, health kept; NVML is released")
	for _, g := range b.gpus {
		b.setUnmonitored(g, sink, true)
	}
	b.stats.add(func(s *Stats) { s.DriverGone = gone.Error() })
	return gone
}

// goneAtInit is the *DriverGoneError of an nvmlInit that failed because the driver went away
// (not loaded, another kernel module version), nil otherwise.
func goneAtInit(err error, at time.Time) *DriverGoneError {
	var ret nvml.Return
	if !errors.As(err, &ret) || (ret != nvml.ERROR_DRIVER_NOT_LOADED && ret != nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
		return nil
	}
	return &DriverGoneError{Op: "initialising NVML again after a GPU reset", Ret: ret, At: at}
}

// DriverGone returns the error that ended Run when the driver went away under it, or nil.
func (b *Backend) DriverGone() *DriverGoneError { return b.gone.Load() }
