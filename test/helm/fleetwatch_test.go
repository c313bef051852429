package helm

import (
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/fleet/records"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestFleetSharedCausesChart: config.fleet.sharedCauses runs the breaker controller (alone, if
// nothing else does) with the agents' HealthConfig, from which it reads the section, and grants it
// exactly watch.ClusterRoleRules() more; its Role already covers watch.RoleRules(). Off (the
// default), the controller may read no pods.
func TestFleetSharedCausesChart(t *testing.T) {
	requireHelm(t)
	const controller = "gpuhealth-breaker-controller"
	for _, tc := range []struct {
		name  string
		set   []string
		rules []rbacv1.PolicyRule
		on    bool
	}{
		{name: "off", set: []string{"config.fleet.records.enabled=false"}, rules: breaker.ControllerClusterRoleRules()},
		{name: "alone", set: []string{"config.fleet.sharedCauses.enabled=true", "breakerController.agentSilence.enabled=false", "config.fleet.records.enabled=false"},
			rules: append(breaker.ControllerClusterRoleRules(), watch.ClusterRoleRules()...), on: true},
		{name: "beside the silent taint and the records", set: []string{"config.fleet.sharedCauses.enabled=true", "breakerController.agentSilence.taint=true",
			"config.fleet.sharedCauses.labels={topology.kubernetes.io/rack}", "config.fleet.sharedCauses.every=30s"},
			rules: slices.Concat(breaker.ControllerClusterRoleRules(), breaker.SilentTaintClusterRoleRules(), watch.ClusterRoleRules(), records.ControllerClusterRoleRules()), on: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			var clusterRole rbacv1.ClusterRole
			r.get(t, "ClusterRole", controller, &clusterRole)
			if !equality.Semantic.DeepEqual(clusterRole.Rules, tc.rules) {
				t.Errorf("breaker controller ClusterRole:\n got %s\nwant %s", rulesString(clusterRole.Rules), rulesString(tc.rules))
			}
			var role rbacv1.Role
			r.get(t, "Role", controller, &role)
			if !equality.Semantic.DeepEqual(role.Rules, breaker.ControllerRoleRules()) || !covers(role.Rules, watch.RoleRules()) {
				t.Errorf("breaker controller Role %s: want breaker.ControllerRoleRules(), covering watch.RoleRules() %s",
					rulesString(role.Rules), rulesString(watch.RoleRules()))
			}
			cfg := controllerConfig(t, r, controller)
			sc := cfg.Fleet.SharedCauses
			if sc.IsEnabled() != tc.on {
				t.Errorf("the HealthConfig the controller reads: fleet.sharedCauses %+v, want enabled %v", sc, tc.on)
			}
			if tc.name == "beside the silent taint and the records" && (sc.Period() != 30*time.Second || !slices.Equal(sc.Labels, []string{"topology.kubernetes.io/rack"})) {
				t.Errorf("fleet.sharedCauses %+v: want every 30s and the rack label", sc)
			}
		})
	}
}

// controllerConfig returns the HealthConfig the breaker controller's --config names, read from
// the ConfigMap its pod mounts there.
func controllerConfig(t *testing.T, r rendered, controller string) *config.HealthConfig {
	t.Helper()
	var dep appsv1.Deployment
	r.get(t, "Deployment", controller, &dep)
	pod := dep.Spec.Template.Spec
	ctr := pod.Containers[0]
	var path string
	for _, a := range ctr.Args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			path = p
		}
	}
	if path == "" {
		t.Fatalf("breaker controller args %v: no --config", ctr.Args)
	}
	var cmName, key string
	for _, m := range ctr.VolumeMounts {
		if rest, ok := strings.CutPrefix(path, m.MountPath+"/"); ok && m.ReadOnly {
			key = rest
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.ConfigMap != nil {
					cmName = v.ConfigMap.Name
				}
			}
		}
	}
	if cmName == "" {
		t.Fatalf("--config=%s is on no read-only ConfigMap mount: %+v, volumes %+v", path, ctr.VolumeMounts, pod.Volumes)
	}
	if dep.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("the breaker controller's pod has no checksum/config: a changed fleet section would not restart it")
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", cmName, &cm)
	cfg, err := config.Parse([]byte(cm.Data[key]))
	if err != nil {
		t.Fatalf("the HealthConfig %s/%s: %v", cmName, key, err)
	}
	return cfg
}

// covers reports whether rules grant everything want does.
func covers(rules, want []rbacv1.PolicyRule) bool {
	for _, w := range want {
		for _, group := range w.APIGroups {
			for _, res := range w.Resources {
				for _, verb := range w.Verbs {
					if !slices.ContainsFunc(rules, func(r rbacv1.PolicyRule) bool {
						return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) && slices.Contains(r.Verbs, verb) && len(r.ResourceNames) == 0
					}) {
						return false
					}
				}
			}
		}
	}
	return true
}
