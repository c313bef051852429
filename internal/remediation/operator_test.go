package remediation

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

type nodeOf map[string]string

func (n nodeOf) Get(context.Context) (*corev1.Node, error) {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: n}}, nil
}

// TestOperatorMaintenanceHoldsEveryGPU: while the GPU operator upgrades the driver, changes MIG
// or has paused GPU clients, every GPU is held (no reset), saying why; before and after it is not.
func TestOperatorMaintenanceHoldsEveryGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels nodeOf
		want   []string
	}{
		{"no operator", nodeOf{}, nil},
		{"operator idle", nodeOf{OperatorUpgradeStateLabel: "upgrade-done", OperatorMIGStateLabel: "success", "nvidia.com/gpu.deploy.dcgm": "true"}, nil},
		{"a failed upgrade does not block repairs", nodeOf{OperatorUpgradeStateLabel: "upgrade-failed"}, nil},
		{"driver upgrade", nodeOf{OperatorUpgradeStateLabel: "pod-deletion-required"},
			[]string{"GPU operator: driver upgrade (nvidia.com/gpu-driver-upgrade-state=pod-deletion-required)"}},
		{"MIG change", nodeOf{OperatorMIGStateLabel: "pending", "nvidia.com/gpu.deploy.client": "paused-for-mig-change"},
			[]string{"GPU operator: MIG reconfiguration (nvidia.com/mig.config.state=pending)", "GPU operator: client paused-for-mig-change (nvidia.com/gpu.deploy.client)"}},
		{"clients paused for the driver", nodeOf{"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade"},
			[]string{"GPU operator: device-plugin paused-for-driver-upgrade (nvidia.com/gpu.deploy.device-plugin)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := OperatorMaintenance{Node: tc.labels}.Holders(context.Background(), health.Device{UUID: "GPU-a"}, nil)
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("Holders = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestOperatorPauses: only the component labels the operator's managers pause count, each named
// with its value, in a stable order; the upgrade state alone pauses nothing.
func TestOperatorPauses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string
	}{
		{"no operator", nil, nil},
		{"components running", map[string]string{"nvidia.com/gpu.deploy.device-plugin": "true", "nvidia.com/gpu.deploy.dcgm": "false"}, nil},
		{"upgrade under way, clients not paused yet", map[string]string{OperatorUpgradeStateLabel: "cordon-required"}, nil},
		{"driver manager paused the clients", map[string]string{
			"nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
			"nvidia.com/gpu.deploy.client":        "paused-for-driver-upgrade",
			"nvidia.com/gpu.deploy.dcgm":          "true",
		}, []string{"nvidia.com/gpu.deploy.client=paused-for-driver-upgrade", "nvidia.com/gpu.deploy.device-plugin=paused-for-driver-upgrade"}},
		{"MIG manager paused the clients", map[string]string{"nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-mig-change"},
			[]string{"nvidia.com/gpu.deploy.dcgm-exporter=paused-for-mig-change"}},
		{"a look-alike label outside the operator's prefix", map[string]string{"example.com/gpu.deploy.x": "paused-for-driver-upgrade"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := OperatorPauses(tc.labels); !slices.Equal(got, tc.want) {
				t.Errorf("OperatorPauses = %q, want %q", got, tc.want)
			}
		})
	}
}
