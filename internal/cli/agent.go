package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/cli/agentcmd"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// The agent command lives in agentcmd, which cmd/gpuhealth-agent links alone.
func newAgentCommand() *cobra.Command { return agentcmd.NewCommand() }

func openBackend(ctx context.Context, backend, scenarioPath, node string, sampleEvery time.Duration, nvmlOpts *cmdutil.NVMLOptions, extra ...gpunvml.Option) (agentcmd.ResettingBackend, string, func(), error) {
	return agentcmd.OpenBackend(ctx, backend, scenarioPath, node, sampleEvery, nvmlOpts, extra...)
}

func openKernelLog(ctx context.Context, cfg *config.HealthConfig, backend string, devices []health.Device, bootID string) *agent.KernelLog {
	return agentcmd.OpenKernelLog(ctx, cfg, backend, devices, bootID)
}

// newComponentClient builds the client of a long-running component (agent, extender): from a
// kubeconfig file, or from the in-cluster configuration, with its user agent and rate limits.
func newComponentClient(kubeconfig, userAgent string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := cmdutil.ComponentConfig(kubeconfig, userAgent, qps, burst)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// componentConfig is the rest.Config behind newComponentClient, for components that need other
// clients (metadata) too.
func componentConfig(kubeconfig, userAgent string, qps float32, burst int) (*rest.Config, error) {
	return cmdutil.ComponentConfig(kubeconfig, userAgent, qps, burst)
}
