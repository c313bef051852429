package helm

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// removableAnnotations is what the policy lets the agent remove and never add or change: the
// operators' requests it applies once, clears (`gpuhealth clear`) and validations (`gpuhealth
// validate`). Both, whatever the options: an agent that does not validate still answers a
// validation request (GPUValidationNotConfigured) and removes it.
var removableAnnotations = "['" + gpuhealthv1.ClearsKey + "', '" + gpuhealthv1.ValidationRequestsKey + "']"

// optionSets are the values that change the own-node policy's variables.
var optionSets = [][]string{
	nil,
	{"config.remediation.enabled=true", "config.remediation.pauseOperatorComponents=true", "config.agent.circuitBreaker.enabled=true"},
	{"config.remediation.enabled=true", "config.remediation.validation.enabled=true", "agent.validation.dcgmImage=dcgm:4"},
	{"config.agent.reporters={annotation,hami}"},
}

// TestAdmissionPolicyLetsTheAgentOnlyRemoveClears: the operators' clear requests are not the
// agent's. It may remove gpuhealth.dev/gpu-clears (having applied the requests) and never add or
// change it, with every option that changes the policy; the drains stay out of its reach. The
// e2e policy test (TestHelmChartConfinesAgentToItsNode) runs these rules on a real API server.
func TestAdmissionPolicyLetsTheAgentOnlyRemoveClears(t *testing.T) {
	testOnlyRemovable(t, gpuhealthv1.ClearsKey)
}

// TestAdmissionPolicyLetsTheAgentOnlyRemoveValidationRequests: likewise the operators'
// validation requests (`gpuhealth validate`): the agent removes
// gpuhealth.dev/gpu-validation-requests once it has applied them, and can never ask for a
// validation (or take one back) in an operator's name.
func TestAdmissionPolicyLetsTheAgentOnlyRemoveValidationRequests(t *testing.T) {
	testOnlyRemovable(t, gpuhealthv1.ValidationRequestsKey)
}

// testOnlyRemovable checks, for every option set, that the policy lets the agent remove key and
// nothing else of it, and that the agent can patch its Node to do so.
func testOnlyRemovable(t *testing.T, key string) {
	requireHelm(t)
	for _, set := range optionSets {
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
			if got := vars["removableAnnotations"]; got != removableAnnotations {
				t.Errorf("removableAnnotations = %q, want %q", got, removableAnnotations)
			}
			if !strings.Contains(vars["removableAnnotations"], "'"+key+"'") {
				t.Errorf("removableAnnotations %s: the agent may not remove %s", vars["removableAnnotations"], key)
			}
			for _, k := range []string{key, gpuhealthv1.DrainsKey} {
				if strings.Contains(vars["ownedAnnotations"], k) {
					t.Errorf("ownedAnnotations %s: the agent may write %s", vars["ownedAnnotations"], k)
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
