package watch

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules are what the Watcher needs cluster-wide beyond what the breaker controller
// has already (breaker.ControllerClusterRoleRules: the Nodes and ResourceSlices listed and
// watched, Events): the running pods, listed and watched, for the workloads, and the
// ResourceClaims, for the GPUs their pods hold through them. Without pods it judges without
// workloads; without claims, without the GPUs held through them.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"list", "watch"}},
	}
}

// RoleRules are what it needs in its namespace: the findings ConfigMap, read, created and
// updated. The breaker controller's Role (breaker.ControllerRoleRules) grants them already.
func RoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
	}
}
