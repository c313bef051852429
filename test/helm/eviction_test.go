package helm

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestEvictionIsOptIn: without config.agent.eviction.enabled the chart grants no pod eviction,
// no pod reads and no policy for them; with it, exactly agent.EvictionClusterRoleRules, the
// policy that confines evictions to the agent's node, the pod-resources mount, and the
// eviction settings in the agent's HealthConfig.
func TestEvictionIsOptIn(t *testing.T) {
	requireHelm(t)
	r := render(t)
	for _, k := range []string{"ClusterRole/gpuhealth-agent-eviction", "ClusterRoleBinding/gpuhealth-agent-eviction",
		"ValidatingAdmissionPolicy/gpuhealth-agent-evict-own-node", "ValidatingAdmissionPolicyBinding/gpuhealth-agent-evict-own-node"} {
		kind, name, _ := strings.Cut(k, "/")
		if r.has(kind, name) {
			t.Errorf("default values render %s", k)
		}
	}

	r = render(t, "config.agent.eviction.enabled=true", "config.agent.eviction.dryRun=true", "config.agent.eviction.reportOnlyNamespaces={research}")
	var role rbacv1.ClusterRole
	r.get(t, "ClusterRole", "gpuhealth-agent-eviction", &role)
	if want := agent.EvictionClusterRoleRules(); !equality.Semantic.DeepEqual(role.Rules, want) {
		t.Errorf("eviction ClusterRole rules\n got %s\nwant %s", rulesString(role.Rules), rulesString(want))
	}
	var binding rbacv1.ClusterRoleBinding
	r.get(t, "ClusterRoleBinding", "gpuhealth-agent-eviction", &binding)
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "gpuhealth-agent" {
		t.Errorf("eviction binding %+v", binding)
	}
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	r.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-evict-own-node", &policy)
	if pk := policy.Spec.ParamKind; pk == nil || pk.Kind != "Pod" || pk.APIVersion != "v1" {
		t.Errorf("eviction policy paramKind %+v, want v1 Pod", pk)
	}
	if rr := policy.Spec.MatchConstraints.ResourceRules; len(rr) != 1 || rr[0].Resources[0] != "pods/eviction" {
		t.Errorf("eviction policy matches %+v", rr)
	}
	var pb admissionregistrationv1.ValidatingAdmissionPolicyBinding
	r.get(t, "ValidatingAdmissionPolicyBinding", "gpuhealth-agent-evict-own-node", &pb)
	if p := pb.Spec.ParamRef; p == nil || p.Selector == nil || p.ParameterNotFoundAction == nil || *p.ParameterNotFoundAction != admissionregistrationv1.DenyAction {
		t.Errorf("eviction binding paramRef %+v", p)
	}
	var own admissionregistrationv1.ValidatingAdmissionPolicy
	r.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node", &own)
	found := false
	for _, v := range own.Spec.Variables {
		found = found || (v.Name == "ownedAnnotations" && strings.Contains(v.Expression, gpuhealthv1.EvictionsKey))
	}
	if !found {
		t.Errorf("the own-node policy does not let the agent write %s", gpuhealthv1.EvictionsKey)
	}

	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
	cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
	if err != nil {
		t.Fatalf("rendered HealthConfig: %v", err)
	}
	if e := cfg.Agent.Eviction; !e.Enabled || !e.DryRun || len(e.ReportOnlyNamespaces) != 1 || e.ExcludeNamespaces[0] != "kube-system" {
		t.Errorf("rendered eviction config %+v", e)
	}
	if !strings.Contains(mustJSON(t, r, "DaemonSet", "gpuhealth-agent"), `"mountPath":"/var/lib/kubelet/pod-resources"`) {
		t.Error("the agent does not mount the pod-resources socket with eviction on")
	}
}

func mustJSON(t *testing.T, r rendered, kind, name string) string {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("%s/%s not rendered", kind, name)
	}
	b, err := o.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
