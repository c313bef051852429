// Package agentcmd is the agent command, `gpuhealth agent`, in a package of its own so that the
// lean agent binary (cmd/gpuhealth-agent) links the agent and nothing of the other commands.
package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// NewCommand returns the agent command, `gpuhealth agent`.
func NewCommand() *cobra.Command {
	var (
		backend, scenarioPath, nodeName, kubeconfig, configPath, metricsAddress, checkpoint string
		logs                                                                                cmdutil.LogOptions
		nvmlOpts                                                                            cmdutil.NVMLOptions
	)
	cmd := &cobra.Command{
		Use:   "agent [--backend nvml|sim] [--scenario FILE] [--node-name NAME] [--kubeconfig FILE] [--config FILE]",
		Short: "Watch this node's GPUs and report their health to Kubernetes (the DaemonSet's job)",
		Long: `agent watches this node's GPUs and makes each GPU's health visible to every scheduler path:
the Volcano-compatible volcano.sh/gpu-unhealthy-ids and gpuhealth.dev/gpu-health Node
annotations, one DRA DeviceTaintRule per sick GPU, the GPUUnhealthy Node condition, Node Events
and Prometheus metrics. Sticky faults survive restarts through a checkpoint file.

With --backend sim it replays a scenario on the real clock (and keeps running after its end).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.Context(cmd)
			if err != nil {
				return err
			}
			if nodeName == "" {
				nodeName = os.Getenv("NODE_NAME")
			}
			if nodeName == "" {
				return cmdutil.BadInput(errors.New("--node-name: required (or set NODE_NAME)"))
			}
			if err := checkBackendFlags(backend, scenarioPath); err != nil {
				return err
			}
			cfg, policy, err := cmdutil.LoadConfig(configPath)
			if err != nil {
				return err
			}
			agentCfg := cfg.AgentSection()
			if checkpoint != "" {
				agentCfg.CheckpointPath = checkpoint
			}
			restConfig, err := cmdutil.ComponentConfig(kubeconfig, "gpuhealth", agent.ClientQPS, agent.ClientBurst)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			client, err := kube.NewForConfig(restConfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			logger := klog.FromContext(ctx)
			var away *driverAway
			if v := os.Getenv(DriverAwayEnv); v != "" {
				if a, err := parseDriverAway(v); err != nil {
					logger.Error(err, "Ignoring the record of an earlier release of NVML")
				} else {
					away = &a
					logger.Info("This image of the agent follows a release of NVML", "since", a.Since, "reason", a.Reason)
				}
			}
			// The Node cache every reporter reads also carries the GPU operator's pause labels.
			nodes := nodecache.New(client, nodeName)
			cacheCtx, stopCache := context.WithCancel(ctx)
			defer func() {
				stopCache()
				nodes.Shutdown()
			}()
			var pause *OperatorPause
			if backend == "nvml" {
				if pause, err = WatchOperatorPause(nodes); err != nil {
					return err
				}
				// In the background: an API server that does not answer yet must not keep the
				// agent from serving /healthz while it waits for the driver (the pause is read
				// live until the cache is filled, and a Node that cannot be read pauses nothing).
				go func() {
					if err := nodes.Start(cacheCtx); err != nil && cacheCtx.Err() == nil {
						logger.Error(err, "Watching this node's GPU operator labels")
					}
				}()
			}
			// Without NVML yet (the driver container is still starting, say), or while the GPU
			// operator pauses GPU clients, the agent waits.
			opened, err := waitForDriver(ctx, driverWait{node: nodeName, client: client, metricsAddress: metricsAddress, pause: pause, away: away},
				func() (openedBackend, error) {
					var o openedBackend
					var err error
					o.backend, o.bootID, o.cleanup, err = OpenBackend(ctx, backend, scenarioPath, nodeName, cfg.SampleEvery(), &nvmlOpts,
						gpunvml.WithExpectedNVLinks(cfg.ExpectedNVLinks()))
					return o, err
				})
			if err != nil {
				return err
			}
			be, bootID := opened.backend, opened.bootID
			missing := MissingGPUs(ctx, cfg.Inventory, backend, be)
			// The kernel log names GPUs by address: lines about a missing one are kept against it.
			kernelLog := OpenKernelLog(ctx, cfg, backend, slices.Concat(be.Devices(), missing), bootID)
			released := func() {
				kernelLog.Close()
				opened.cleanup()
			}
			rem := agent.RemediationOptions{Config: cfg.Remediation, Poll: cfg.SampleEvery()}
			if rem.Config.Enabled {
				if rem.Resetter, err = be.Resetter(rem.Config.WithDefaults().ResetCommand); err != nil {
					released()
					return cmdutil.BadInput(fmt.Errorf("remediation.resetCommand: %w", err))
				}
				// The simulator tests its GPUs itself; real GPUs run the validation command.
				rem.Diagnoser, _ = be.(gpu.Diagnoser)
			}
			bootTime, err := agent.ReadBootTime()
			if err != nil {
				logger.Error(err, "No boot time: faults will not be restored from the node if the checkpoint is lost")
			}
			runCtx, stopRun := context.WithCancelCause(ctx)
			defer stopRun(nil)
			if pause != nil {
				go pause.whenPaused(runCtx, stopRun)
			}
			err = agent.Run(runCtx, agent.Options{
				NodeName: nodeName, Client: client, Backend: be, Policy: policy, BootID: bootID, BootTime: bootTime,
				Agent: agentCfg, MetricsAddress: metricsAddress, KernelLog: kernelLog, Remediation: rem, Nodes: nodes,
				Missing: missing,
			})
			// Every loop has returned: NVML is shut down here, whatever comes next.
			released()
			if ctx.Err() != nil {
				return err
			}
			var release *driverAway
			var gone *gpunvml.DriverGoneError
			var changed *gpunvml.InventoryChangedError
			switch p, paused := isPaused(context.Cause(runCtx)); {
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
		},
	}
	f := cmd.Flags()
	f.StringVar(&backend, "backend", "nvml", "GPU backend: nvml or sim")
	f.StringVar(&scenarioPath, "scenario", "", "scenario file (with --backend sim)")
	f.StringVar(&nodeName, "node-name", "", "this node's name (default $NODE_NAME)")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&configPath, "config", "", "HealthConfig file, with its optional agent section")
	f.StringVar(&metricsAddress, "metrics-address", ":9402", "address for /metrics, /healthz and /readyz (empty: off)")
	f.StringVar(&checkpoint, "checkpoint", "", "checkpoint file (default from the config, else "+config.DefaultCheckpointPath+"; - turns it off)")
	nvmlOpts.AddFlags(f)
	logs.AddFlags(f)
	return cmd
}

// checkBackendFlags refuses --backend and --scenario values that cannot go together, before
// anything is opened.
func checkBackendFlags(backend, scenarioPath string) error {
	switch {
	case backend != "nvml" && backend != "sim":
		return cmdutil.BadInput(fmt.Errorf("--backend: must be nvml or sim, got %q", backend))
	case backend == "sim" && scenarioPath == "":
		return cmdutil.BadInput(errors.New("--scenario: required with --backend sim"))
	case backend == "nvml" && scenarioPath != "":
		return cmdutil.BadInput(errors.New("--scenario: only with --backend sim"))
	}
	return nil
}

// openedBackend is what OpenBackend returns, in one value.
type openedBackend struct {
	backend ResettingBackend
	bootID  string
	cleanup func()
}

// simAgentBackend adapts the simulator to the agent: it replays on the real clock and keeps
// sampling after the scenario's end.
type simAgentBackend struct{ b *sim.Backend }

func (s simAgentBackend) Devices() []health.Device { return s.b.Devices() }

// Placeholders are the scenario's missing GPUs (gpus.missing): the simulator's PCI bus.
func (s simAgentBackend) Placeholders() []health.Device { return s.b.Placeholders() }
func (s simAgentBackend) Run(ctx context.Context, sink gpu.Sink) error {
	return s.b.Run(ctx, sink)
}

// Resetter: the simulator resets its GPUs itself; the command is for real GPUs.
func (s simAgentBackend) Resetter([]string) (gpu.Resetter, error) { return s.b, nil }

// Diagnose: the simulated GPUs' diagnostic answers as DCGM's does (gpu.Diagnoser).
func (s simAgentBackend) Diagnose(ctx context.Context, uuid string) ([]byte, int, error) {
	return s.b.Diagnose(ctx, uuid)
}

type nvmlAgentBackend struct{ b *gpunvml.Backend }

func (n nvmlAgentBackend) Devices() []health.Device { return n.b.Devices() }
func (n nvmlAgentBackend) Run(ctx context.Context, sink gpu.Sink) error {
	return n.b.Run(ctx, sink)
}

// SourceName and Up: gpuhealth_source_up{source="nvml"}.
func (n nvmlAgentBackend) SourceName() string { return "nvml" }
func (n nvmlAgentBackend) Up() bool           { return n.b.Up() }

// Stalled: /healthz fails while an NVML call hangs (agent.Staller).
func (n nvmlAgentBackend) Stalled(now time.Time) error { return n.b.Stalled(now) }

func (n nvmlAgentBackend) Resetter(command []string) (gpu.Resetter, error) {
	return n.b.CommandResetter(command)
}

// ResettingBackend is an agent backend that can reset its GPUs.
type ResettingBackend interface {
	gpu.Backend
	Resetter(command []string) (gpu.Resetter, error)
}

// OpenBackend opens the GPU backend named by backend (nvml or sim, with its scenario) and
// returns it with the boot ID the agent keys its checkpoint with and a function that closes it.
// With the simulator, node (when set) wins over the scenario's own node: every agent of a
// DaemonSet replays the same scenario on its own node's GPUs.
// The NVML backend's library is found under nvmlOpts' driver root; without a usable driver the
// error wraps gpunvml.ErrNoDriver.
// extra are further options of the NVML backend (the expected NVLinks).
func OpenBackend(ctx context.Context, backend, scenarioPath, node string, sampleEvery time.Duration, nvmlOpts *cmdutil.NVMLOptions, extra ...gpunvml.Option) (ResettingBackend, string, func(), error) {
	if err := checkBackendFlags(backend, scenarioPath); err != nil {
		return nil, "", nil, err
	}
	switch backend {
	case "sim":
		sc, err := sim.LoadScenario(scenarioPath)
		if err != nil {
			return nil, "", nil, cmdutil.BadInput(err)
		}
		if node != "" && node != sc.Node {
			klog.FromContext(ctx).Info("Replaying the scenario on this node", "scenarioNode", sc.Node, "node", node)
			sc = sc.OnNode(node)
		}
		b := sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: sampleEvery, Forever: true})
		return simAgentBackend{b}, b.BootID(), func() {}, nil
	case "nvml":
		b, err := nvmlOpts.Open(append([]gpunvml.Option{gpunvml.WithSamplePeriod(sampleEvery), gpunvml.WithLogger(klog.FromContext(ctx))}, extra...)...)
		if err != nil {
			return nil, "", nil, err
		}
		bootID, err := health.ReadBootID()
		if err != nil {
			_ = b.Close()
			return nil, "", nil, err
		}
		return nvmlAgentBackend{b}, bootID, func() { _ = b.Close() }, nil
	}
	return nil, "", nil, cmdutil.BadInput(fmt.Errorf("--backend: must be nvml or sim, got %q", backend))
}

// OpenKernelLog opens the node's kernel log beside the NVML backend, as the config's kernelLog
// section says. The simulator reads no kernel log of the machine it runs on: its scenarios
// carry kernel-log lines of their own (kmsg events), which it parses itself.
func OpenKernelLog(ctx context.Context, cfg *config.HealthConfig, backend string, devices []health.Device, bootID string) *kmsg.Companion {
	k := cfg.KernelLogSection()
	if backend != "nvml" || k.Enabled == nil || !*k.Enabled {
		return kmsg.NewCompanion()
	}
	return kmsg.OpenCompanion(ctx, kmsg.CompanionOptions{Path: k.Path, Devices: devices, BootID: bootID})
}

// NVMLBackend returns the NVML backend OpenBackend opened (nil for the simulator).
func NVMLBackend(be ResettingBackend) *gpunvml.Backend {
	if n, ok := be.(nvmlAgentBackend); ok {
		return n.b
	}
	return nil
}
