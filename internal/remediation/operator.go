package remediation

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The GPU operator's node labels that say it is working on the node's driver or MIG layout
// (facts from its current code, listed in docs/helm.md, "Beside the GPU operator").
const (
	// OperatorUpgradeStateLabel walks through the driver upgrade: upgrade-required,
	// cordon-required, ..., upgrade-done (or upgrade-failed).
	OperatorUpgradeStateLabel = "nvidia.com/gpu-driver-upgrade-state"
	// OperatorMIGStateLabel is the MIG manager's: pending and rebooting while it reconfigures.
	OperatorMIGStateLabel = "nvidia.com/mig.config.state"
	// OperatorDeployLabelPrefix starts the per-component labels the operator's managers pause
	// ("paused-for-driver-upgrade", "paused-for-mig-change") or turn off ("false").
	OperatorDeployLabelPrefix = "nvidia.com/gpu.deploy."
	// OperatorPausedPrefix starts the values of a paused component label.
	OperatorPausedPrefix = "paused-for-"
)

// NodeGetter reads this agent's Node (the agent's shared node cache).
type NodeGetter interface {
	Get(ctx context.Context) (*corev1.Node, error)
}

// OperatorMaintenance holds every GPU while NVIDIA's GPU operator upgrades the node's driver,
// reconfigures its MIG layout or has paused GPU clients for either: a reset then would race the
// driver's unload or the MIG manager's own reset (which resets every GPU and fails while any
// client holds one), and the operator's components come back afterwards anyway. Its holder
// names the label, so a waiting GPU says why.
type OperatorMaintenance struct {
	Node NodeGetter
}

var _ HolderFinder = OperatorMaintenance{}

// Holders implements HolderFinder.
func (o OperatorMaintenance) Holders(ctx context.Context, _ health.Device, _ []health.Device) ([]string, error) {
	node, err := o.Node.Get(ctx)
	if err != nil {
		return nil, err
	}
	return OperatorWork(node.Labels), nil
}

// OperatorWork describes what the GPU operator is doing to the node, from its labels: one entry
// per label that says it is at work (none when it is not, or the node is not the operator's).
func OperatorWork(labels map[string]string) []string {
	var out []string
	switch v := labels[OperatorUpgradeStateLabel]; v {
	case "", "upgrade-done", "upgrade-failed":
	default:
		out = append(out, "GPU operator: driver upgrade ("+OperatorUpgradeStateLabel+"="+v+")")
	}
	switch v := labels[OperatorMIGStateLabel]; v {
	case "pending", "rebooting":
		out = append(out, "GPU operator: MIG reconfiguration ("+OperatorMIGStateLabel+"="+v+")")
	}
	for k, v := range labels {
		if strings.HasPrefix(k, OperatorDeployLabelPrefix) && strings.HasPrefix(v, OperatorPausedPrefix) {
			out = append(out, "GPU operator: "+strings.TrimPrefix(k, OperatorDeployLabelPrefix)+" "+v+" ("+k+")")
		}
	}
	slices.Sort(out)
	return out
}

// OperatorPauses lists the GPU operator's component labels on the node that pause GPU clients
// ("nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade"), sorted; none when nothing
// is paused. The driver manager sets them before it unloads the driver, the MIG manager before
// it resets the GPUs for a new MIG layout: both fail while any process holds a GPU, so every
// NVML client must let go until the labels are back.
func OperatorPauses(labels map[string]string) []string {
	var out []string
	for k, v := range labels {
		if strings.HasPrefix(k, OperatorDeployLabelPrefix) && strings.HasPrefix(v, OperatorPausedPrefix) {
			out = append(out, k+"="+v)
		}
	}
	slices.Sort(out)
	return out
}
