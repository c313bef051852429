// Package nodegpu opens this node's GPUs for the components that watch them on the node, the
// agent and the device plugin: the GPU backend (NVML, or the simulator replaying a scenario),
// the kernel log read beside it, the GPUs the node should have and the backend lacks, and the
// GPU operator's pause labels, which say when no process may hold the driver. Both commands
// start from here, so that neither imports the other.
package nodegpu

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// BackendFlags name the GPU backend a command opens: --backend and --scenario.
type BackendFlags struct {
	// Backend is nvml or sim; Scenario is the simulator's scenario file.
	Backend, Scenario string
}

// AddFlags registers --backend and --scenario on f.
func (b *BackendFlags) AddFlags(f *pflag.FlagSet) {
	f.StringVar(&b.Backend, "backend", "nvml", "GPU backend: nvml or sim")
	f.StringVar(&b.Scenario, "scenario", "", "scenario file (with --backend sim)")
}

// Validate refuses --backend and --scenario values that cannot go together, as bad input,
// before anything is opened.
func (b BackendFlags) Validate() error {
	switch {
	case b.Backend != "nvml" && b.Backend != "sim":
		return cmdutil.BadInput(fmt.Errorf("--backend: must be nvml or sim, got %q", b.Backend))
	case b.Backend == "sim" && b.Scenario == "":
		return cmdutil.BadInput(errors.New("--scenario: required with --backend sim"))
	case b.Backend == "nvml" && b.Scenario != "":
		return cmdutil.BadInput(errors.New("--scenario: only with --backend sim"))
	}
	return nil
}

// Options say which backend Open opens, and how.
type Options struct {
	BackendFlags
	// Node, when set, wins over the scenario's own node: every agent of a DaemonSet replays the
	// same scenario on its own node's GPUs. NVML ignores it.
	Node string
	// Config gives the sample period and the NVLinks each GPU should have.
	Config *config.HealthConfig
	// NVML says where the driver's library is; it remembers the library its first Open loaded.
	NVML *cmdutil.NVMLOptions
}

// Opened is a backend Open opened.
type Opened struct {
	Backend ResettingBackend
	// BootID keys the checkpoint: what a reboot clears is cleared on a new one.
	BootID string
	// Close closes the backend (NVML is shut down).
	Close func()
}

// ResettingBackend is a GPU backend that can reset its GPUs.
type ResettingBackend interface {
	gpu.Backend
	Resetter(command []string) (gpu.Resetter, error)
}

// Open opens the GPU backend o names. The simulator replays its scenario on the real clock and
// keeps sampling after its end. The NVML backend's library is found under o.NVML's driver
// root; without a usable driver the error wraps gpunvml.ErrNoDriver.
func Open(ctx context.Context, o Options) (Opened, error) {
	if err := o.Validate(); err != nil {
		return Opened{}, err
	}
	sampleEvery := o.Config.SampleEvery()
	if o.Backend == "sim" {
		sc, err := sim.LoadScenario(o.Scenario)
		if err != nil {
			return Opened{}, cmdutil.BadInput(err)
		}
		if o.Node != "" && o.Node != sc.Node {
			klog.FromContext(ctx).Info("Replaying the scenario on this node", "scenarioNode", sc.Node, "node", o.Node)
			sc = sc.OnNode(o.Node)
		}
		b := sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: sampleEvery, Forever: true})
		return Opened{Backend: simBackend{b}, BootID: b.BootID(), Close: func() {}}, nil
	}
	b, err := o.NVML.Open(gpunvml.WithSamplePeriod(sampleEvery), gpunvml.WithLogger(klog.FromContext(ctx)),
		gpunvml.WithExpectedNVLinks(o.Config.ExpectedNVLinks()))
	if err != nil {
		return Opened{}, err
	}
	bootID, err := health.ReadBootID()
	if err != nil {
		_ = b.Close()
		return Opened{}, err
	}
	return Opened{Backend: nvmlBackend{b}, BootID: bootID, Close: func() { _ = b.Close() }}, nil
}

// NVMLBackend returns the NVML backend Open opened (nil for the simulator).
func NVMLBackend(be ResettingBackend) *gpunvml.Backend {
	if n, ok := be.(nvmlBackend); ok {
		return n.Backend
	}
	return nil
}

// simBackend is the simulator for the agent and the device plugin: a gpu.Backend as it is (its
// Run takes the gpu.Sink), with its scenario's missing GPUs (Placeholders: the simulator's PCI
// bus) and the DCGM-like diagnostic of its GPUs (gpu.Diagnoser); it adds the Resetter.
type simBackend struct{ *sim.Backend }

var (
	_ ResettingBackend   = simBackend{}
	_ placeholderBackend = simBackend{}
	_ gpu.Diagnoser      = simBackend{}
)

// Resetter: the simulator resets its GPUs itself; the command is for real GPUs.
func (s simBackend) Resetter([]string) (gpu.Resetter, error) { return s.Backend, nil }

// nvmlBackend is the NVML backend for the agent and the device plugin: a gpu.Backend as it is,
// whose Up (gpuhealth_source_up{source="nvml"}) and Stalled (/healthz fails while an NVML call
// hangs: agent.Staller) the agent reads; it adds the source's name and the Resetter.
type nvmlBackend struct{ *gpunvml.Backend }

var _ ResettingBackend = nvmlBackend{}

// SourceName names the backend in gpuhealth_source_up.
func (n nvmlBackend) SourceName() string { return "nvml" }

// Resetter resets a GPU by running the command (gpunvml.Backend.CommandResetter).
func (n nvmlBackend) Resetter(command []string) (gpu.Resetter, error) {
	return n.CommandResetter(command)
}
