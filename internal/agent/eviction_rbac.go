package agent

import rbacv1 "k8s.io/api/rbac/v1"

// EvictionClusterRoleRules are what agent.eviction adds, in a ClusterRole of its own (the
// chart's gpuhealth-agent-eviction, present only with eviction on): reading the pods that hold
// a GPU (by name, and the node's pods for Volcano's card annotations), evicting them, and an
// Event on each evicted pod, which lives in the pod's namespace. RBAC cannot name "pods on my
// Node": the chart's admission policy lets an agent evict only pods bound to its own node.
func EvictionClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}
