package breaker

import rbacv1 "k8s.io/api/rbac/v1"

// ControllerClusterRoleRules are what `gpuhealth breaker controller` needs cluster-wide: the
// Nodes (their gpu-health annotations and GPU capacity) and the ResourceSlices, to count GPUs.
func ControllerClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch"}},
	}
}

// ControllerRoleRules are what it needs in the breaker's namespace: the ConfigMap it writes the
// count to and reads acknowledgements from, the Lease of its leader election, and the slots it
// sweeps (listed, and deleted once they stop counting).
func ControllerRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
	}
}
