package helm

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// TestAdmissionPolicyLetsTheAgentOnlyRemoveClears: the operators' clear requests are not the
// agent's. It may remove gpuhealth.dev/gpu-clears (having applied the requests) and never add or
// change it, with every option that changes the policy; the drains stay out of its reach. The
// e2e policy test (TestHelmChartConfinesAgentToItsNode) runs these rules on a real API server.
func TestAdmissionPolicyLetsTheAgentOnlyRemoveClears(t *testing.T) {
	requireHelm(t)
	for _, set := range [][]string{
		nil,
		{"config.remediation.enabled=true", "config.remediation.pauseOperatorComponents=true", "config.agent.circuitBreaker.enabled=true"},
		{"config.agent.reporters={annotation,hami}"},
	} {
		name := strings.Join(set, ",")
		if name == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			r := render(t, set...)
			var policy admissionregistrationv1.ValidatingAdmissionPolicy
			r.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node", &policy)
			vars := map[string]string{}
			var order []string
			for _, v := range policy.Spec.Variables {
				vars[v.Name] = v.Expression
				order = append(order, v.Name)
			}
			if got, want := vars["removableAnnotations"], "['"+gpuhealthv1.ClearsKey+"']"; got != want {
				t.Errorf("removableAnnotations = %q, want %q", got, want)
			}
			for _, key := range []string{gpuhealthv1.ClearsKey, gpuhealthv1.DrainsKey} {
				if strings.Contains(vars["ownedAnnotations"], key) {
					t.Errorf("ownedAnnotations %s: the agent may write %s", vars["ownedAnnotations"], key)
				}
			}
			// foreignAnnotationChanges is what the request adds or changes, plus what it removes:
			// only the removal may pass over the removable annotations.
			changed, removed, ok := strings.Cut(vars["foreignAnnotationChanges"], "+")
			if !ok || strings.Contains(changed, "removableAnnotations") ||
				!strings.Contains(removed, "!(k in variables.removableAnnotations)") || !strings.Contains(removed, "!(k in variables.newAnnotations)") {
				t.Errorf("foreignAnnotationChanges = %q: want additions and changes of every annotation not owned, and removals but of the removable ones", vars["foreignAnnotationChanges"])
			}
			if slices.Index(order, "removableAnnotations") > slices.Index(order, "foreignAnnotationChanges") {
				t.Errorf("variables %v: removableAnnotations must come before its use", order)
			}
			denial := false
			for _, v := range policy.Spec.Validations {
				denial = denial || (strings.Contains(v.Expression, "size(variables.foreignAnnotationChanges) == 0") &&
					strings.Contains(v.MessageExpression, "variables.removableAnnotations"))
			}
			if !denial {
				t.Error("no validation denies foreign annotation changes naming what the agent may remove")
			}
			// The agent removes the requests with a patch of its Node.
			var role rbacv1.ClusterRole
			r.get(t, "ClusterRole", "gpuhealth-agent", &role)
			if !slices.ContainsFunc(role.Rules, func(rule rbacv1.PolicyRule) bool {
				return slices.Contains(rule.Resources, "nodes") && slices.Contains(rule.Verbs, "patch")
			}) {
				t.Errorf("the agent's ClusterRole cannot patch Nodes: %s", rulesString(role.Rules))
			}
		})
	}
}
