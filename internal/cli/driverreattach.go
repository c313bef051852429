package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The device plugin across the driver going away (an upgrade, a driver container restart). The
// kubelet marks every device of a plugin unhealthy the moment the plugin goes, so the plugin
// does not restart while the driver is away: its backend shuts NVML down (no device file stays
// open, the module can unload) and the plugin keeps serving its devices with their last known
// health, unmonitored. When the driver is back:
//
//   - as the same library file, the backend opens NVML again in this process and carries on on
//     the same monitor: nothing the kubelet sees moves;
//   - as another file (an upgrade), which this process can never load (the dynamic loader keeps
//     the first), it waits until a child process (`gpuhealth probe`) opens NVML on it, and then
//     re-executes itself: the new image restores its faults from the checkpoint and registers
//     again. So does a driver back with another set of GPUs.
//
// The agent does not keep the library mapped meanwhile (it re-executes at once): it serves no
// kubelet, and it must hold nothing of the driver root. See docs/nvml.md.

// errReexec asks the device plugin command to re-execute itself.
var errReexec = errors.New("the NVIDIA driver came back as another library: this process must start afresh to load it")

// nvmlSession is what reattachingBackend needs of an NVML backend (*gpunvml.Backend).
type nvmlSession interface {
	Devices() []health.Device
	DriverVersion() string
	Run(ctx context.Context, sink gpu.Sink) error
	Close() error
}

var _ nvmlSession = (*gpunvml.Backend)(nil)

// reattachingBackend is the device plugin's NVML backend across the driver going away.
type reattachingBackend struct {
	// current is the backend Run runs; it is replaced (under mu) after the driver came back.
	// Devices are the first backend's.
	mu      sync.Mutex
	current nvmlSession
	devices []health.Device
	// open opens NVML again in this process; changed reports whether the driver root holds
	// another library than the one loaded; probe opens NVML in a child process.
	open    func() (nvmlSession, error)
	changed func() (bool, error)
	probe   func(ctx context.Context) error
	clock   clock.Clock
	log     logr.Logger
	// initial and max bound the wait between looks at the driver.
	initial, max time.Duration
	// pause, when set, is the GPU operator's pause of GPU clients on the node: while it lasts
	// NVML is shut down, as when the driver went away.
	pause pauseWatch
}

// pauseWatch is the GPU operator's pause labels on the node (nodegpu.OperatorPause).
type pauseWatch interface {
	Reason(ctx context.Context) string
	Changes() <-chan struct{}
}

var _ gpu.Backend = (*reattachingBackend)(nil)

// Devices implements gpu.Backend.
func (r *reattachingBackend) Devices() []health.Device { return r.devices }

// Run implements gpu.Backend: it runs the current backend and, each time the driver goes
// away under it, closes it, waits for the driver and runs the next one on the same sink. It
// returns errReexec when only a new process can go on.
func (r *reattachingBackend) Run(ctx context.Context, sink gpu.Sink) error {
	for {
		current := r.currentSession()
		paused, err := r.runUnlessPaused(ctx, current, sink)
		if paused != "" {
			if cerr := current.Close(); cerr != nil {
				r.log.V(2).Info("Shutting NVML down for the GPU operator's pause", "err", cerr.Error())
			}
			for _, d := range r.devices {
				sink.SetUnmonitored(d.UUID, true)
			}
			r.log.Info("The GPU operator paused GPU clients: NVML is shut down; the devices keep their last known health, unmonitored, until it resumes them", "reason", paused)
			if !r.waitUnpaused(ctx) {
				return nil
			}
			if err := r.reattach(ctx); err != nil {
				return err
			}
			continue
		}
		if errors.Is(err, gpunvml.ErrInventoryChanged) {
			// Another set of devices for the kubelet: a fresh process serves them.
			_ = current.Close()
			r.log.Info("The MIG layout changed: starting afresh", "change", err.Error())
			return errReexec
		}
		var gone *gpunvml.DriverGoneError
		if !errors.As(err, &gone) {
			return err
		}
		if cerr := current.Close(); cerr != nil {
			r.log.V(2).Info("Shutting NVML down after the driver went away", "err", cerr.Error())
		}
		r.log.Info("The NVIDIA driver went away: NVML is shut down; the devices keep their last known health, unmonitored, until it is back", "reason", gone.Error())
		if err := r.reattach(ctx); err != nil {
			return err
		}
	}
}

// reattach waits for the driver and makes the session it opens the current one; errReexec when
// only a new process can go on.
func (r *reattachingBackend) reattach(ctx context.Context) error {
	next, err := r.waitBack(ctx)
	if err != nil {
		return err
	}
	if got := uuids(next.Devices()); !slices.Equal(got, uuids(r.devices)) {
		_ = next.Close()
		r.log.Info("The driver came back with other GPUs: starting afresh", "before", uuids(r.devices), "now", got)
		return errReexec
	}
	r.log.Info("The NVIDIA driver is back: watching the GPUs again", "driverVersion", next.DriverVersion())
	r.mu.Lock()
	r.current = next
	r.mu.Unlock()
	return nil
}

// runUnlessPaused runs the session until it returns or the GPU operator pauses GPU clients; it
// returns the pause's reason ("" when not paused) or the session's result.
func (r *reattachingBackend) runUnlessPaused(ctx context.Context, current nvmlSession, sink gpu.Sink) (string, error) {
	if r.pause == nil {
		return "", current.Run(ctx, sink)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	paused := make(chan string, 1)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for {
			if reason := r.pause.Reason(runCtx); reason != "" {
				paused <- reason
				stop()
				return
			}
			select {
			case <-runCtx.Done():
				return
			case <-r.pause.Changes():
			}
		}
	}()
	err := current.Run(runCtx, sink)
	stop()
	<-watched // the pause's changes are waitUnpaused's from here
	select {
	case reason := <-paused:
		if ctx.Err() == nil {
			return reason, nil
		}
	default:
	}
	return "", err
}

// waitUnpaused waits until no label pauses GPU clients; false when ctx ended first.
func (r *reattachingBackend) waitUnpaused(ctx context.Context) bool {
	for r.pause.Reason(ctx) != "" {
		select {
		case <-ctx.Done():
			return false
		case <-r.pause.Changes():
		}
	}
	return ctx.Err() == nil
}

// currentSession is the session Run runs now.
func (r *reattachingBackend) currentSession() nvmlSession {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current
}

// waitBack looks at the driver with backoff until NVML opens again in this process (the same
// library), or a child process opens it on another library (errReexec), or ctx ends.
func (r *reattachingBackend) waitBack(ctx context.Context) (nvmlSession, error) {
	delay := r.initial
	for {
		timer := r.clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-timer.C():
		}
		delay = min(2*delay, r.max)
		changed, err := r.changed()
		switch {
		case err != nil:
			r.log.V(2).Info("The driver is not back yet", "reason", err.Error())
		case changed:
			if perr := r.probe(ctx); perr != nil {
				r.log.V(2).Info("A new driver library is there, not ready yet", "reason", perr.Error())
				continue
			}
			return nil, errReexec
		default:
			b, err := r.open()
			if err == nil {
				return b, nil
			}
			if errors.Is(err, gpunvml.ErrDriverGone) || !errors.Is(err, gpunvml.ErrNoDriver) {
				// The module answers this library with a version mismatch, or something else
				// is wrong with it here: a fresh process decides.
				if perr := r.probe(ctx); perr == nil {
					return nil, errReexec
				}
			}
			r.log.V(2).Info("The driver is not back yet", "reason", err.Error())
		}
	}
}

func uuids(devs []health.Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.UUID)
	}
	slices.Sort(out)
	return out
}

// probeInChild runs `gpuhealth probe` with args (the driver root flags) as a child process: nil
// once it opens NVML there.
func probeInChild(args []string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, exe, append([]string{"probe", "-o", "json"}, args...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("gpuhealth probe: %w: %s", err, tailOf(out, 400))
		}
		return nil
	}
}

func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
