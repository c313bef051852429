package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
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

// reexec replaces this process with a fresh image of its own binary, with away in
// DriverAwayEnv. It returns only when the exec fails.
func reexec(away driverAway) error {
	return cmdutil.Reexec(DriverAwayEnv + "=" + away.encode())
}

// OperatorPause follows the GPU operator's pause labels on a Node (the agent's and the device
// plugin's).
type OperatorPause struct {
	node    func(context.Context) (*corev1.Node, error)
	changed chan struct{}
}

// WatchOperatorPause registers on nodes (which the caller starts) and returns the watch.
func WatchOperatorPause(nodes *nodecache.Cache) (*OperatorPause, error) {
	p := &OperatorPause{node: nodes.Get, changed: make(chan struct{}, 1)}
	notify := func() {
		select {
		case p.changed <- struct{}{}:
		default:
		}
	}
	err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	})
	if err != nil {
		return nil, fmt.Errorf("watching the GPU operator's labels: %w", err)
	}
	return p, nil
}

// Reason says which of the operator's labels pause GPU clients now ("" when none does). A Node
// that cannot be read pauses nothing: the agent keeps doing what it does.
func (p *OperatorPause) Reason(ctx context.Context) string {
	reason, _ := p.lookup(ctx)
	return reason
}

// pausedReasonPrefix starts every reason Reason gives.
const pausedReasonPrefix = "the GPU operator paused GPU clients"

// lookup is Reason, with the error when the Node cannot be read.
func (p *OperatorPause) lookup(ctx context.Context) (string, error) {
	if p == nil {
		return "", nil
	}
	n, err := p.node(ctx)
	if err != nil {
		return "", err
	}
	pauses := remediation.OperatorPauses(n.Labels)
	if len(pauses) == 0 {
		return "", nil
	}
	return pausedReasonPrefix + " (" + strings.Join(pauses, ", ") + ")", nil
}

// Changes is signalled after every change of the Node.
func (p *OperatorPause) Changes() <-chan struct{} {
	if p == nil {
		return nil
	}
	return p.changed
}

// whenPaused cancels run (with errPaused as its cause) once the operator pauses GPU clients, and
// returns when ctx ends.
func (p *OperatorPause) whenPaused(ctx context.Context, run context.CancelCauseFunc) {
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
