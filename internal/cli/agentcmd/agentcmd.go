// Package agentcmd is the agent command, `gpuhealth agent`, in a package of its own so that the
// lean agent binary (cmd/gpuhealth-agent) links the agent and nothing of the other commands.
// Options are its flags; Run is the agent's start-up, step by step, from the flags to the
// running agent (run.go); the GPUs it opens are internal/nodegpu's.
package agentcmd

import (
	"context"
	"errors"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// NewCommand returns the agent command, `gpuhealth agent`.
func NewCommand() *cobra.Command {
	var (
		o    Options
		logs cmdutil.LogOptions
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
		RunE: logs.RunE(o.Validate, func(ctx context.Context) error { return Run(ctx, o) }),
	}
	o.AddFlags(cmd.Flags())
	logs.AddFlags(cmd.Flags())
	return cmd
}

// Options are the agent's flags.
type Options struct {
	// BackendFlags name the GPU backend: NVML, or the simulator replaying a scenario.
	nodegpu.BackendFlags
	// NodeName is this node's name: --node-name, else $NODE_NAME (Validate reads it).
	NodeName string
	// Kubeconfig is the kubeconfig file; empty means the in-cluster configuration.
	Kubeconfig string
	// Config is the HealthConfig file; Checkpoint, when set, is the checkpoint file instead of
	// the config's ("-" turns it off).
	Config, Checkpoint string
	// MetricsAddress serves /metrics, /healthz and /readyz; empty turns the server off.
	MetricsAddress string
	// NVML says where the driver's library is (--driver-root, --nvml-library-paths).
	NVML cmdutil.NVMLOptions
}

// AddFlags registers the agent's flags on f.
func (o *Options) AddFlags(f *pflag.FlagSet) {
	o.BackendFlags.AddFlags(f)
	f.StringVar(&o.NodeName, "node-name", "", "this node's name (default $NODE_NAME)")
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&o.Config, "config", "", "HealthConfig file, with its optional agent section")
	f.StringVar(&o.MetricsAddress, "metrics-address", ":9402", "address for /metrics, /healthz and /readyz (empty: off)")
	f.StringVar(&o.Checkpoint, "checkpoint", "", "checkpoint file (default from the config, else "+config.DefaultCheckpointPath+"; - turns it off)")
	o.NVML.AddFlags(f)
}

// Validate takes the node's name from $NODE_NAME when --node-name is not given (the one place
// the agent reads it), and refuses flags that cannot go together, as bad input (exit status 2),
// before anything is opened.
func (o *Options) Validate() error {
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if o.NodeName == "" {
		return cmdutil.BadInput(errors.New("--node-name: required (or set NODE_NAME)"))
	}
	return o.BackendFlags.Validate()
}
