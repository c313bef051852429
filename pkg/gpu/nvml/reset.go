package nvml

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// UUIDPlaceholder in a reset command's arguments is replaced by the GPU's UUID.
const UUIDPlaceholder = "{uuid}"

// maxResetOutput bounds how much of the command's output an error quotes.
const maxResetOutput = 512

// CommandResetter returns a gpuapi.Resetter that resets this backend's GPUs by running argv, with
// UUIDPlaceholder replaced by the GPU's UUID. NVML has no call that resets a GPU; NVIDIA's tool
// for it is `nvidia-smi --gpu-reset -i <UUID>`, which refuses while any process holds the GPU
// open, monitoring clients such as this backend included (and, on NVSwitch systems, leaves the
// fabric to Fabric Manager). So the reset lets go of NVML first: it parks the event loop and the
// sampler, frees the event set and shuts NVML down; after the command it initialises NVML again,
// takes a fresh handle of every GPU by UUID, and Run makes the event set anew (see session.go).
// One reset runs at a time. A reset the command reports as done is passed on as
// health.SignalReset at the start of the GPU's next sampling round: the volatile ECC totals,
// the backend's other sign of a reset, only fall when there were errors.
func (b *Backend) CommandResetter(argv []string) (gpuapi.Resetter, error) {
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" {
		return nil, errors.New("reset command: empty")
	}
	return &commandResetter{b: b, argv: append([]string(nil), argv...), run: runCommand}, nil
}

type commandResetter struct {
	b    *Backend
	argv []string
	// run runs the command and returns its combined output.
	run func(ctx context.Context, argv []string) ([]byte, error)
}

// resetWaitDelay bounds how long a killed command's children may keep its output open.
const resetWaitDelay = 5 * time.Second

func runCommand(ctx context.Context, argv []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = resetWaitDelay
	return cmd.CombinedOutput()
}

// Reset resets the GPU uuid. It waits for a reset in progress, then for the event loop's wait
// in flight (up to WithEventWait) and the sampling round in flight. NVML is initialised again
// whatever the command's outcome; when that fails the reset's result still stands, and Run
// keeps trying (the GPUs are unmonitored meanwhile).
func (r *commandResetter) Reset(ctx context.Context, uuid string) error {
	var target *gpu
	for _, g := range r.b.gpus {
		if g.dev.UUID == uuid {
			target = g
		}
	}
	if target == nil {
		return fmt.Errorf("reset %s: not a GPU of this node (MIG instances are reset with their GPU)", uuid)
	}
	args := make([]string, len(r.argv))
	for i, a := range r.argv {
		args[i] = strings.ReplaceAll(a, UUIDPlaceholder, uuid)
	}
	command := strings.Join(args, " ")
	b := r.b
	if err := b.lockSession(ctx); err != nil {
		return fmt.Errorf("reset %s: waiting for another reset: %w", uuid, err)
	}
	defer b.unlockSession()
	if b.closed {
		return fmt.Errorf("reset %s: %w", uuid, errClosed)
	}
	log := b.log.WithValues("gpu", uuid, "command", command)
	if err := b.release(ctx); err != nil {
		return fmt.Errorf("reset %s: letting go of NVML: %w", uuid, err)
	}
	log.V(1).Info("NVML shut down for a GPU reset: events are not delivered until it is back")
	out, runErr := r.run(ctx, args)
	if runErr == nil {
		target.mu.Lock()
		// The totals restart with the reset: the next reading is the new baseline, not a
		// second reset. The NVLinks train anew (on NVSwitch systems once Fabric Manager has
		// registered the GPU again): they are scanned again.
		target.eccValid = false
		target.linksScanned = false
		target.mu.Unlock()
		target.resetDone.Store(true)
	}
	if err := b.reacquire(); err != nil {
		log.Error(err, "NVML could not be initialised again after the reset: retrying; every GPU is unmonitored meanwhile")
	}
	if runErr != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > maxResetOutput {
			msg = "..." + msg[len(msg)-maxResetOutput:]
		}
		return fmt.Errorf("reset %s: %s: %w: %s", uuid, command, runErr, msg)
	}
	log.Info("GPU reset")
	return nil
}

// emitCommandReset reports a reset made by CommandResetter since the last round.
func (b *Backend) emitCommandReset(g *gpu, base health.Signal, sink gpuapi.Sink) {
	if g.resetDone.Swap(false) {
		b.stats.add(func(s *Stats) { s.Resets++ })
		sink.Signal(with(base, health.SignalReset))
	}
}
