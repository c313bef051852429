package remediation

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

// Slots is the cluster-wide budget (Budget).
type Slots interface {
	TakeSlot(ctx context.Context, uuid string) (bool, error)
	ReleaseSlot(ctx context.Context, uuid string) error
}

// Observer receives what remediation does, for metrics (metrics.Remediation).
type Observer interface {
	Event(kind string, d time.Duration)
	Phases(counts map[string]int)
}

// Options configure a Controller. Every field but StatePath, Observer and Changed is required.
type Options struct {
	NodeName string
	Config   Config
	// Poll is how often a waiting GPU's holders and slot are asked again, and the clock checked
	// (the agent passes its sampling interval).
	Poll     time.Duration
	Clock    clock.WithTicker
	Holders  HolderFinder
	Slots    Slots
	Resetter gpuapi.Resetter
	// StatePath is the state file (empty: the state lives in memory only); BootID is this boot's.
	StatePath string
	BootID    string
	Recorder  record.EventRecorder
	NodeRef   *corev1.ObjectReference
	Observer  Observer
	// Changed is called (from Run's goroutine) when the repair states changed, so the reporters
	// get the snapshot decorated anew.
	Changed func()
	// Components finds the GPU operator's components on the node, and Pauser pauses and
	// restores them (Config.PauseComponents); nil: none are looked for.
	Components ComponentFinder
	Pauser     *ComponentPauser
	// ProcRoot is where a failed reset looks for the processes holding the GPU ("" is /proc).
	ProcRoot string
	// Validator tests a GPU before it goes back (Config.Validate), each run bounded by
	// ValidationTimeout; Validated records each verdict in the GPU's history (the health
	// monitor's RecordValidation). ValidateAfterReboot are the GPUs that had a fault pending
	// when the node rebooted (the health tracker's RebootRepaired): with Config.Validate they
	// are validated before they are offered again.
	Validator           Validator
	ValidationTimeout   time.Duration
	Validated           func(uuid string, result health.ValidationResult, by string, at time.Time) error
	ValidateAfterReboot []string
	// AfterReboot turns validation after a reboot on (remediation.validation.afterReboot).
	AfterReboot bool
}

// Validator runs the active test of one GPU and reads its verdict: validation.Command on the
// NVML backend, the simulated GPUs' diagnostic on the sim backend. It returns when the test
// ended or ctx is done (a verdict of validation.Error then).
type Validator interface {
	Validate(ctx context.Context, dev health.Device) validation.Verdict
}

// ComponentFinder lists the GPU operator's components running on the node (Components).
type ComponentFinder interface {
	Running(ctx context.Context) ([]Component, error)
}

// Controller runs the Machine for the agent: it feeds it the latest snapshot and the backend's
// reset signals, runs resets in goroutines it owns, records Events and metrics, and keeps the
// state file.
type Controller struct {
	opts    Options
	machine *Machine

	mu       sync.Mutex
	snap     health.Snapshot
	haveSnap bool
	runCtx   context.Context

	wake   chan struct{}
	resets sync.WaitGroup
	last   map[string]State
}

// New returns a Controller, restored from the state file when it belongs to this boot.
func New(ctx context.Context, opts Options) (*Controller, error) {
	if opts.NodeName == "" || opts.Clock == nil || opts.Holders == nil || opts.Slots == nil || opts.Resetter == nil ||
		opts.Recorder == nil || opts.NodeRef == nil || opts.Poll <= 0 {
		return nil, errors.New("remediation: node name, clock, holders, slots, resetter, recorder, node reference and poll period are required")
	}
	c := &Controller{opts: opts, wake: make(chan struct{}, 1)}
	c.machine = NewMachine(opts.Config, opts.Clock, c)
	if opts.StatePath != "" {
		states, err := LoadState(opts.StatePath, opts.BootID)
		switch {
		case err != nil:
			klog.FromContext(ctx).Error(err, "Ignoring the remediation state file; repairs start afresh", "path", opts.StatePath)
		case len(states) > 0:
			klog.FromContext(ctx).Info("Resuming remediation", "gpus", len(states), "path", opts.StatePath)
		}
		c.machine.Restore(states)
	}
	if opts.Config.Validate && opts.AfterReboot {
		// The GPUs with a fault pending, and those under repair (or given up on) when the node
		// went down, whose own conditions the reset may have cleared.
		gpus := slices.Clone(opts.ValidateAfterReboot)
		if opts.StatePath != "" {
			underRepair, err := UnderRepairBeforeReboot(opts.StatePath, opts.BootID)
			if err != nil {
				klog.FromContext(ctx).Error(err, "Cannot tell which GPUs were under repair before the reboot", "path", opts.StatePath)
			}
			gpus = append(gpus, underRepair...)
		}
		slices.Sort(gpus)
		if gpus = slices.Compact(gpus); len(gpus) > 0 {
			klog.FromContext(ctx).Info("Validating the GPUs that had a fault when the node rebooted before they are offered again", "gpus", gpus)
			c.machine.ValidateAfterReboot(gpus)
		}
	}
	c.last = c.machine.States()
	return c, nil
}

// Update hands the controller the latest snapshot (undecorated).
func (c *Controller) Update(snap health.Snapshot) {
	c.mu.Lock()
	c.snap, c.haveSnap = snap, true
	c.mu.Unlock()
	c.nudge()
}

// RequestValidation asks for a validation of the GPU (an operator's request, see
// Machine.RequestValidation).
func (c *Controller) RequestValidation(uuid, why string) {
	c.machine.RequestValidation(uuid, why)
	c.nudge()
}

// Validates reports whether the controller validates GPUs before they go back.
func (c *Controller) Validates() bool { return c.opts.Config.Validate }

// ResetObserved records a reset the backend reported (health.SignalReset) outside the snapshot;
// the agent's snapshots carry every reset in the GPU's history, which Step reads itself.
func (c *Controller) ResetObserved(uuid string, at time.Time) {
	c.machine.ResetObserved(uuid, at)
	c.nudge()
}

// Decorate returns snap as the reporters must see it (see Decorate).
func (c *Controller) Decorate(snap health.Snapshot) health.Snapshot {
	return Decorate(snap, c.machine.States())
}

// States returns the repair states, by GPU UUID.
func (c *Controller) States() map[string]State { return c.machine.States() }

// MaxAttempts is the configured limit.
func (c *Controller) MaxAttempts() int { return c.opts.Config.MaxAttempts }

func (c *Controller) nudge() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Run steps the machine on every snapshot, reset result and poll tick until ctx is done; it
// returns once the resets it started have returned.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("component", "remediation")
	ctx = klog.NewContext(ctx, logger)
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	defer c.resets.Wait()
	c.observePhases(c.last)
	ticker := c.opts.Clock.NewTicker(c.opts.Poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
		case <-ticker.C():
		}
		c.mu.Lock()
		snap, ok := c.snap, c.haveSnap
		c.mu.Unlock()
		if !ok {
			continue
		}
		for _, e := range c.machine.Step(ctx, snap) {
			c.record(ctx, e)
		}
		states := c.machine.States()
		if maps.EqualFunc(states, c.last, func(a, b State) bool { return reflect.DeepEqual(a, b) }) {
			continue
		}
		c.last = states
		if c.opts.StatePath != "" {
			if err := SaveState(c.opts.StatePath, c.opts.BootID, states); err != nil {
				logger.Error(err, "Could not save the remediation state; a restart now would start repairs afresh", "path", c.opts.StatePath)
			}
		}
		c.observePhases(states)
		if c.opts.Changed != nil {
			c.opts.Changed()
		}
	}
}

func (c *Controller) observePhases(states map[string]State) {
	if c.opts.Observer == nil {
		return
	}
	counts := map[string]int{}
	for _, p := range []Phase{PhaseWaitingForPods, PhaseWaitingForSlot, PhasePausingComponents, PhaseResetting, PhaseValidating, PhaseProbation, PhaseBlocked, PhaseFailed} {
		counts[string(p)] = 0
	}
	for _, s := range states {
		if s.Phase != PhaseIdle {
			counts[string(s.Phase)]++
		}
	}
	c.opts.Observer.Phases(counts)
}

func (c *Controller) record(ctx context.Context, e Event) {
	klog.FromContext(ctx).Info("GPU remediation", "gpu", e.Device.UUID, "index", e.Device.Index, "step", e.Kind, "message", e.Message)
	typ := corev1.EventTypeNormal
	if e.Warning {
		typ = corev1.EventTypeWarning
	}
	if e.Device.UUID == "" { // about the node: components paused by an earlier agent
		c.opts.Recorder.Eventf(c.opts.NodeRef, typ, e.Reason(), "%s", e.Message)
	} else {
		c.opts.Recorder.Eventf(c.opts.NodeRef, typ, e.Reason(), "GPU %d (%s): %s", e.Device.Index, e.Device.UUID, e.Message)
	}
	if c.opts.Observer != nil {
		c.opts.Observer.Event(string(e.Kind), e.Duration)
	}
	if e.Validation != "" && c.opts.Validated != nil {
		if err := c.opts.Validated(e.Device.UUID, e.Validation, e.By, c.opts.Clock.Now()); err != nil {
			klog.FromContext(ctx).Error(err, "Could not record the validation in the GPU's history", "gpu", e.Device.UUID)
		}
	}
}

// Holders implements Env.
func (c *Controller) Holders(ctx context.Context, dev health.Device, migs []health.Device) ([]string, error) {
	return c.opts.Holders.Holders(ctx, dev, migs)
}

// TakeSlot implements Env.
func (c *Controller) TakeSlot(ctx context.Context, uuid string) (bool, error) {
	return c.opts.Slots.TakeSlot(ctx, uuid)
}

// ReleaseSlot implements Env; a slot that cannot be released expires by itself.
func (c *Controller) ReleaseSlot(ctx context.Context, uuid string) error {
	err := c.opts.Slots.ReleaseSlot(ctx, uuid)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not release the remediation slot; it expires by itself", "gpu", uuid)
	}
	return err
}

// StartReset implements Env: the reset runs in a goroutine Run waits for, bounded by the reset
// timeout, and its result wakes Run.
func (c *Controller) StartReset(dev health.Device) {
	c.spawn(func(ctx context.Context) {
		rctx, cancel := context.WithTimeout(ctx, c.opts.Config.ResetTimeout)
		err := c.opts.Resetter.Reset(rctx, dev.UUID)
		cancel()
		if err != nil {
			// Say who holds the GPU, not only that the tool refused.
			if holders, herr := DeviceHolders(c.opts.ProcRoot, dev.Minor, os.Getpid()); herr == nil && len(holders) > 0 {
				err = fmt.Errorf("%w; processes holding the GPU's device file: %s", err, strings.Join(holders, ", "))
			}
		}
		c.machine.ResetFinished(dev.UUID, err)
	})
}

// spawn runs f with Run's context in a goroutine Run waits for, and wakes Run when f returns.
func (c *Controller) spawn(f func(ctx context.Context)) {
	c.mu.Lock()
	ctx := c.runCtx
	c.mu.Unlock()
	c.resets.Add(1)
	go func() {
		defer c.resets.Done()
		f(ctx)
		c.nudge()
	}()
}

var (
	_ ComponentEnv  = (*Controller)(nil)
	_ ValidationEnv = (*Controller)(nil)
)

// StartValidation implements ValidationEnv: the test runs in a goroutine Run waits for,
// bounded by ValidationTimeout, and its verdict wakes Run.
func (c *Controller) StartValidation(dev health.Device) {
	c.spawn(func(ctx context.Context) {
		start := c.opts.Clock.Now()
		v := validation.Verdict{Result: validation.Error, Message: "no validator configured for this backend"}
		if c.opts.Validator != nil {
			vctx, cancel := context.WithTimeout(ctx, c.opts.ValidationTimeout)
			v = c.opts.Validator.Validate(vctx, dev)
			if vctx.Err() != nil && v.Result == validation.Passed {
				// Never a pass from a run that was cut short.
				v = validation.Verdict{Result: validation.Error, Message: "the test was cut short: " + vctx.Err().Error()}
			}
			cancel()
		}
		c.machine.ValidationFinished(dev.UUID, v, c.opts.Clock.Since(start))
	})
}

// Components implements ComponentEnv.
func (c *Controller) Components(ctx context.Context) ([]Component, error) {
	if c.opts.Components == nil {
		return nil, nil
	}
	return c.opts.Components.Running(ctx)
}

// PauseComponents implements ComponentEnv.
func (c *Controller) PauseComponents(ctx context.Context, labels []string) ([]string, error) {
	if c.opts.Pauser == nil {
		return nil, errors.New("no pauser of the GPU operator's components configured")
	}
	return c.opts.Pauser.Pause(ctx, labels)
}

// RestoreComponents implements ComponentEnv.
func (c *Controller) RestoreComponents(ctx context.Context) ([]string, error) {
	if c.opts.Pauser == nil {
		return nil, nil
	}
	return c.opts.Pauser.Restore(ctx)
}

// PausedComponents implements ComponentEnv.
func (c *Controller) PausedComponents() []string {
	if c.opts.Pauser == nil {
		return nil
	}
	return c.opts.Pauser.Paused()
}
