package watch

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRoleRules are what the Watcher needs cluster-wide beyond what the breaker controller
// has already (breaker.ControllerClusterRoleRules: the Nodes listed and watched, Events): the
// running pods, listed and watched, for the workloads. Without them it judges without workloads.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}},
	}
}

// RoleRules are what it needs in its namespace: the findings ConfigMap, read, created and
// updated. The breaker controller's Role (breaker.ControllerRoleRules) grants them already.
func RoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}},
	}
}
