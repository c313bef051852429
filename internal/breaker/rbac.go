package breaker

import rbacv1 "k8s.io/api/rbac/v1"

// ControllerClusterRoleRules are what `gpuhealth breaker controller` needs cluster-wide: the
// Nodes (their gpu-health annotations and GPU capacity) and the ResourceSlices, to count GPUs;
// and, to mark the nodes whose agents went silent (package silence), the Nodes' status (the
// GPUUnhealthy condition) and Events.
func ControllerClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// SilentTaintClusterRoleRules are what the controller needs more to taint the nodes whose agents
// went silent (--agent-silent-taint): reading and updating a Node's spec.
func SilentTaintClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "update"}},
	}
}

// ControllerRoleRules are what it needs in the breaker's namespace: the ConfigMap it writes the
// count to and reads acknowledgements from, the Lease of its leader election, the slots it
// sweeps (listed, and deleted once they stop counting), and the agents' heartbeat Leases it
// watches.
func ControllerRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
	}
}
