package helm

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/fleet/records"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

// TestGPURecordsChart: by default the breaker controller keeps the GPURecords (its ClusterRole
// grants exactly records.ControllerClusterRoleRules() more) and its HealthConfig turns them on,
// and the agents get the default fleet.repeatOffender (their ClusterRole's gpurecords rule is
// TestAgentClusterRoleIsLeastPrivilege's). Off: the controller may not touch a record. The chart's
// CRD is the one package gpurecord embeds.
func TestGPURecordsChart(t *testing.T) {
	requireHelm(t)
	const controller = "gpuhealth-breaker-controller"
	for _, tc := range []struct {
		name          string
		set           []string
		controllerOn  bool
		repeatOffends bool
	}{
		{name: "default", controllerOn: true, repeatOffends: true},
		{name: "off", set: []string{"config.fleet.records.enabled=false", "config.fleet.repeatOffender=null"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			var clusterRole rbacv1.ClusterRole
			r.get(t, "ClusterRole", controller, &clusterRole)
			want := breaker.ControllerClusterRoleRules()
			if tc.controllerOn {
				want = slices.Concat(want, records.ControllerClusterRoleRules())
			}
			if !equality.Semantic.DeepEqual(clusterRole.Rules, want) {
				t.Errorf("breaker controller ClusterRole:\n got %s\nwant %s", rulesString(clusterRole.Rules), rulesString(want))
			}
			if cfg := controllerConfig(t, r, controller); cfg.Fleet.Records.IsEnabled() != tc.controllerOn {
				t.Errorf("the controller's HealthConfig: fleet.records %+v, want enabled %v", cfg.Fleet.Records, tc.controllerOn)
			}
			if !tc.repeatOffends {
				return
			}
			cfg := controllerConfig(t, r, controller) // the agents' HealthConfig too
			if ro := cfg.Fleet.RepeatOffender; ro == nil || ro.Faults != 3 || ro.Window().Hours() != 720 || !ro.ReplaceGPU {
				t.Errorf("the agents' fleet.repeatOffender: %+v", ro)
			}
		})
	}
	chart, err := Chart()
	if err != nil {
		t.Fatal(err)
	}
	crd, err := os.ReadFile(filepath.Join(chart, "crds", "gpurecords.yaml"))
	if err != nil || string(crd) != string(gpurecord.CRD) {
		t.Errorf("the chart's crds/gpurecords.yaml is not package gpurecord's CRD (%v)", err)
	}
}
