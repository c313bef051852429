package helm

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestRemediationChart(t *testing.T) {
	requireHelm(t)
	off := render(t)
	if off.has("Role", "gpuhealth-agent-remediation") {
		t.Error("the remediation Role is rendered although remediation is off")
	}
	if out, err := Lint(context.Background(), Options{Set: []string{"config.remediation.enabled=true"}}); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := render(t, "config.remediation.enabled=true")
	var role rbacv1.Role
	r.get(t, "Role", "gpuhealth-agent-remediation", &role)
	if want := agent.RemediationRoleRules(1); !equality.Semantic.DeepEqual(role.Rules, want) {
		t.Errorf("chart's remediation Role rules differ from agent.RemediationRoleRules(1):\n got %s\nwant %s", rulesString(role.Rules), rulesString(want))
	}
	var three rbacv1.Role
	render(t, "config.remediation.enabled=true", "config.remediation.maxConcurrent=3").get(t, "Role", "gpuhealth-agent-remediation", &three)
	if want := agent.RemediationRoleRules(3); !equality.Semantic.DeepEqual(three.Rules, want) {
		t.Errorf("with maxConcurrent 3 the remediation Role differs from agent.RemediationRoleRules(3):\n got %s\nwant %s", rulesString(three.Rules), rulesString(want))
	}
	var binding rbacv1.RoleBinding
	r.get(t, "RoleBinding", "gpuhealth-agent-remediation", &binding)
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "gpuhealth-agent" {
		t.Errorf("remediation RoleBinding = %+v", binding)
	}
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	mounted := false
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		mounted = mounted || (m.MountPath == "/var/lib/kubelet/pod-resources" && m.ReadOnly)
	}
	if !mounted {
		t.Error("the kubelet's pod-resources socket is not mounted")
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
	if _, err := config.Parse([]byte(cm.Data["healthconfig.yaml"])); err != nil || !strings.Contains(cm.Data["healthconfig.yaml"], "remediation:") {
		t.Errorf("config %q: %v", cm.Data["healthconfig.yaml"], err)
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	for name, want := range map[string]rendered{"off": off, "on": r} {
		want.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node", &policy)
		vars := map[string]string{}
		for _, v := range policy.Spec.Variables {
			vars[v.Name] = v.Expression
		}
		on := name == "on"
		if strings.Contains(vars["ownedAnnotations"], "gpuhealth.dev/gpu-remediation") != on ||
			strings.Contains(vars["ownedConditions"], "GPURebootRequired") != on || !strings.Contains(vars["ownedConditions"], "GPUUnhealthy") {
			t.Errorf("remediation %s: policy variables %v", name, vars)
		}
	}
}
