package agent

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules are the least privileges the agent needs; the e2e tests run the agent with
// exactly these, and the Helm chart's ClusterRole must match them.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"devicetaintrules"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
		// The claimstatus reporter finds claims through the pods bound to the node (a watch
		// selected by spec.nodeName) and reads each claim by name.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
		// The API server's per-driver check for status.devices: only for claims allocated on
		// the agent's own node (its token is bound to a pod there), only for the GPU driver.
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, Verbs: []string{"associated-node:patch"}, ResourceNames: []string{DefaultDriverName}},
	}
}

// DefaultDriverName is the DRA driver the default ClusterRole lets the agent write claim status
// for; an installation with another driver changes the rule (the Helm chart takes it from values).
const DefaultDriverName = "gpu.nvidia.com"

// ClientQPS and ClientBurst bound the agent's requests to the API server; they are the kubelet's
// defaults. A state change costs about four requests (a write each for the annotation, the
// condition and the rule, and an Event), and the writers coalesce bursts of changes;
// client-go's default of 5 QPS would queue every change behind its rate limiter.
const (
	ClientQPS   = 50
	ClientBurst = 100
)

// BreakerRoleRules are the permissions the circuit breaker needs in its namespace (a Role, not a
// ClusterRole): reading the ConfigMap with the cluster's GPU count and the acknowledgement, and
// taking slots (Leases).
func BreakerRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "create", "update"}},
	}
}

// RemediationRoleRules are the permissions remediation needs in its namespace (a Role): its
// slots (Leases), which it also deletes when a repair ends.
func RemediationRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	}
}
