package nvml

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// UUIDPlaceholder in a reset command's arguments is replaced by the GPU's UUID.
const UUIDPlaceholder = "{uuid}"

// maxResetOutput bounds how much of the command's output an error quotes.
const maxResetOutput = 512

// CommandResetter returns a gpuapi.Resetter that resets this backend's GPUs by running argv, with
// UUIDPlaceholder replaced by the GPU's UUID. NVML has no call that resets a GPU; NVIDIA's tool
// for it is `nvidia-smi --gpu-reset -i <UUID>`, which refuses while any process uses the GPU
// (and, on NVSwitch systems, leaves the fabric to Fabric Manager). A reset the command reports
// as done is passed on as health.SignalReset at the start of the GPU's next sampling round: the
// volatile ECC totals, the backend's other sign of a reset, only fall when there were errors.
func (b *Backend) CommandResetter(argv []string) (gpuapi.Resetter, error) {
	if len(argv) == 0 || strings.TrimSpace(argv[0]) == "" {
		return nil, errors.New("reset command: empty")
	}
	return &commandResetter{b: b, argv: append([]string(nil), argv...)}, nil
}

type commandResetter struct {
	b    *Backend
	argv []string
}

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
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > maxResetOutput {
			msg = "..." + msg[len(msg)-maxResetOutput:]
		}
		return fmt.Errorf("reset %s: %s: %w: %s", uuid, strings.Join(args, " "), err, msg)
	}
	r.b.log.Info("GPU reset", "gpu", uuid, "command", strings.Join(args, " "))
	target.mu.Lock()
	// The totals restart with the reset: the next reading is the new baseline, not a second reset.
	target.eccValid = false
	target.mu.Unlock()
	target.resetDone.Store(true)
	return nil
}

// emitCommandReset reports a reset made by CommandResetter since the last round.
func (b *Backend) emitCommandReset(g *gpu, base health.Signal, sink Sink) {
	if g.resetDone.Swap(false) {
		b.stats.add(func(s *Stats) { s.Resets++ })
		sink.Signal(with(base, health.SignalReset))
	}
}
