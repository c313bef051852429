package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// The driver goes away under a running agent: NVIDIA's GPU operator upgrades or restarts its
// driver container (it pauses every GPU client first, through its nvidia.com/gpu.deploy.*
// labels, and then unloads the kernel module, which fails while any process holds a GPU), or
// the module is reloaded by hand. The agent then lets go of the driver in time and comes back
// when it is there again, possibly as another version:
//
//   - It watches its Node's labels (the Node informer every reporter shares). When the operator
//     pauses GPU clients, the agent stops its loops, shuts NVML down (closing every device file)
//     and re-executes itself.
//   - When NVML itself answers that the driver is gone (gpunvml.ErrDriverGone: not loaded,
//     another kernel module version, the session dead), it does the same.
//
// Re-executing is how a process lets go of the library: once a call is bound to it, the dynamic
// loader keeps libnvidia-ml.so.1 mapped for the life of the process (nvmlShutdown and dlclose
// leave it), and answers a later load of the same name with the old file, which a new driver
// version's module refuses. The new image of the process holds no file of the driver root. It
// is told, through DriverAwayEnv, since when and why NVML was released; while the operator's
// pause lasts it does not touch NVML at all, and then it waits for the driver as at any start.
// Meanwhile every GPU keeps its last known health: the annotations, DeviceTaintRules and the
// checkpoint are left as they were, and the GPUUnhealthy condition is Unknown with the reason
// and the time (the GPUs are unmonitored, not healthy or unhealthy). Back on NVML, the agent
// restores its sticky faults from the checkpoint, as after any restart.

// DriverAwayEnv carries, across the agent's re-execution, when and why it released NVML:
// "<RFC 3339 time> <reason>".
const DriverAwayEnv = "GPUHEALTH_DRIVER_AWAY"

// driverAway is when and why the agent released NVML.
type driverAway struct {
	Since  time.Time
	Reason string
}

func (a driverAway) encode() string { return a.Since.UTC().Format(time.RFC3339Nano) + " " + a.Reason }

// parseDriverAway reads DriverAwayEnv's value. A malformed value is an error (the agent then
// starts as if it had not been away).
func parseDriverAway(v string) (driverAway, error) {
	ts, reason, _ := strings.Cut(v, " ")
	since, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return driverAway{}, fmt.Errorf("%s=%q: want \"<RFC 3339 time> <reason>\": %w", DriverAwayEnv, v, err)
	}
	if reason == "" {
		reason = "unknown"
	}
	return driverAway{Since: since, Reason: reason}, nil
}

// driverAwayFromEnv reads DriverAwayEnv: since when and why an earlier image of this process
// released NVML (nil when none did, or when its record cannot be read).
func driverAwayFromEnv(logger klog.Logger) *driverAway {
	v := os.Getenv(DriverAwayEnv)
	if v == "" {
		return nil
	}
	a, err := parseDriverAway(v)
	if err != nil {
		logger.Error(err, "Ignoring the record of an earlier release of NVML")
		return nil
	}
	logger.Info("This image of the agent follows a release of NVML", "since", a.Since, "reason", a.Reason)
	return &a
}

// reexecAfter is the agent's last step, once its loops returned err and NVML is shut down, ctx
// still on; cause is why the run's context ended. After the GPU operator's pause or the driver
// going away it re-executes the agent, with the release in DriverAwayEnv, so that the new image
// holds no file of the driver until the driver is back; after a new MIG layout it re-executes it
// at once. Otherwise, and when the exec fails, it returns an error.
func reexecAfter(ctx context.Context, cause, err error) error {
	logger := klog.FromContext(ctx)
	var release *driverAway
	var gone *gpunvml.DriverGoneError
	var changed *gpunvml.InventoryChangedError
	switch p, paused := isPaused(cause); {
	case paused:
		release = &driverAway{Since: time.Now(), Reason: p.reason}
	case errors.As(err, &gone):
		release = &driverAway{Since: gone.At, Reason: gone.Error()}
	case errors.As(err, &changed):
		// A new MIG layout: a fresh image opens NVML on it (new inventory, checkpoint
		// restored); nothing waits.
		logger.Info("Re-executing the agent to watch the new MIG layout", "change", changed.Error())
		return cmdutil.Reexec(DriverAwayEnv + "=")
	}
	if release == nil {
		return err
	}
	logger.Info("Released NVML: re-executing the agent so that it holds no file of the driver until the driver is back", "reason", release.Reason)
	return reexec(*release)
}

// reexec replaces this process with a fresh image of its own binary, with away in
// DriverAwayEnv. It returns only when the exec fails.
func reexec(away driverAway) error {
	return cmdutil.Reexec(DriverAwayEnv + "=" + away.encode())
}

// whenPaused cancels run (with a pausedError as its cause) once the operator pauses GPU clients,
// and returns when ctx ends.
func whenPaused(ctx context.Context, p *nodegpu.OperatorPause, run context.CancelCauseFunc) {
	for {
		if r := p.Reason(ctx); r != "" {
			run(&pausedError{reason: r})
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-p.Changes():
		}
	}
}

// pausedError ends the agent's run when the operator pauses GPU clients.
type pausedError struct{ reason string }

func (e *pausedError) Error() string { return e.reason }

// awayError is why NVML is not used while the driver is away: the operator's pause, or how the
// driver went away, and since when. It wraps gpunvml.ErrNoDriver's role for waitForDriver.
type awayError struct{ away driverAway }

func (e *awayError) Error() string {
	return fmt.Sprintf("NVML released since %s: %s; every GPU keeps its last known health, unmonitored until the driver is back",
		e.away.Since.UTC().Format(time.RFC3339), e.away.Reason)
}

// isPaused reports whether err is the cause of a run ended by the operator's pause.
func isPaused(err error) (*pausedError, bool) {
	var p *pausedError
	ok := errors.As(err, &p)
	return p, ok
}
