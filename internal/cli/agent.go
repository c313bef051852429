package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func newAgentCommand() *cobra.Command {
	var (
		backend, scenarioPath, nodeName, kubeconfig, configPath, metricsAddress, checkpoint string
		logs                                                                                logOptions
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
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if nodeName == "" {
				nodeName = os.Getenv("NODE_NAME")
			}
			if nodeName == "" {
				return badInput(errors.New("--node-name: required (or set NODE_NAME)"))
			}
			cfg, policy, err := loadConfig(configPath)
			if err != nil {
				return err
			}
			agentCfg := cfg.AgentSection()
			if checkpoint != "" {
				agentCfg.CheckpointPath = checkpoint
			}
			be, bootID, cleanup, err := openBackend(ctx, backend, scenarioPath, nodeName, cfg.SampleEvery())
			if err != nil {
				return err
			}
			defer cleanup()
			kernelLog := openKernelLog(ctx, cfg, backend, be.Devices(), bootID)
			defer kernelLog.Close()
			rem := agent.RemediationOptions{Config: cfg.Remediation, Poll: cfg.SampleEvery()}
			if rem.Config.Enabled {
				if rem.Resetter, err = be.Resetter(rem.Config.WithDefaults().ResetCommand); err != nil {
					return badInput(fmt.Errorf("remediation.resetCommand: %w", err))
				}
			}
			client, err := newClient(kubeconfig)
			if err != nil {
				return badInput(err)
			}
			bootTime, err := agent.ReadBootTime()
			if err != nil {
				klog.FromContext(ctx).Error(err, "No boot time: faults will not be restored from the node if the checkpoint is lost")
			}
			return agent.Run(ctx, agent.Options{
				NodeName: nodeName, Client: client, Backend: be, Policy: policy, BootID: bootID, BootTime: bootTime,
				Agent: agentCfg, MetricsAddress: metricsAddress, KernelLog: kernelLog, Remediation: rem,
			})
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
	logs.addFlags(f)
	return cmd
}

// simAgentBackend adapts the simulator to the agent: it replays on the real clock and keeps
// sampling after the scenario's end.
type simAgentBackend struct{ b *sim.Backend }

func (s simAgentBackend) Devices() []health.Device { return s.b.Devices() }
func (s simAgentBackend) Run(ctx context.Context, sink agent.Sink) error {
	return s.b.Run(ctx, sink)
}

// Resetter: the simulator resets its GPUs itself; the command is for real GPUs.
func (s simAgentBackend) Resetter([]string) (gpu.Resetter, error) { return s.b, nil }

type nvmlAgentBackend struct{ b *gpunvml.Backend }

func (n nvmlAgentBackend) Devices() []health.Device { return n.b.Devices() }
func (n nvmlAgentBackend) Run(ctx context.Context, sink agent.Sink) error {
	return n.b.Run(ctx, sink)
}

func (n nvmlAgentBackend) Resetter(command []string) (gpu.Resetter, error) {
	return n.b.CommandResetter(command)
}

// resettingBackend is an agent backend that can reset its GPUs.
type resettingBackend interface {
	agent.Backend
	Resetter(command []string) (gpu.Resetter, error)
}

// openBackend opens the GPU backend. With the simulator, node (when set) wins over the scenario's
// own node: every agent of a DaemonSet replays the same scenario on its own node's GPUs.
func openBackend(ctx context.Context, backend, scenarioPath, node string, sampleEvery time.Duration) (resettingBackend, string, func(), error) {
	switch backend {
	case "sim":
		if scenarioPath == "" {
			return nil, "", nil, badInput(errors.New("--scenario: required with --backend sim"))
		}
		sc, err := sim.LoadScenario(scenarioPath)
		if err != nil {
			return nil, "", nil, badInput(err)
		}
		if node != "" && node != sc.Node {
			klog.FromContext(ctx).Info("Replaying the scenario on this node", "scenarioNode", sc.Node, "node", node)
			sc = sc.OnNode(node)
		}
		b := sim.New(sc, sim.Options{Clock: clock.RealClock{}, SampleInterval: sampleEvery, Forever: true})
		return simAgentBackend{b}, b.BootID(), func() {}, nil
	case "nvml":
		if scenarioPath != "" {
			return nil, "", nil, badInput(errors.New("--scenario: only with --backend sim"))
		}
		b, err := gpunvml.OpenSystem(gpunvml.WithSamplePeriod(sampleEvery), gpunvml.WithLogger(klog.FromContext(ctx)))
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
	return nil, "", nil, badInput(fmt.Errorf("--backend: must be nvml or sim, got %q", backend))
}

// newClient builds the agent's client: from a kubeconfig file, or from the in-cluster
// configuration.
func newClient(kubeconfig string) (kubernetes.Interface, error) {
	return newComponentClient(kubeconfig, "gpuhealth", agent.ClientQPS, agent.ClientBurst)
}

// newComponentClient builds the client of a long-running component (agent, extender): from a
// kubeconfig file, or from the in-cluster configuration, with its user agent and rate limits.
func newComponentClient(kubeconfig, userAgent string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := componentConfig(kubeconfig, userAgent, qps, burst)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// componentConfig is the rest.Config behind newComponentClient, for components that need other
// clients (metadata) too.
func componentConfig(kubeconfig, userAgent string, qps float32, burst int) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}
