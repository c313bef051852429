package agent

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// ClusterRoleRulesFor are the least privileges the agent needs cluster-wide with these reporters
// (remediation on or off, and the claimstatus reporter finding claims through a pod watch, or
// not): RBAC cannot name "the Node I run on", so these are cluster-wide, and the chart's admission
// policy narrows every write to the agent's own Node and its own DeviceTaintRules. Pods are
// readable only when a part that lists them runs (remediation, or claimstatus with
// agent.claimStatus.podWatch), ResourceClaims only by name. The Helm chart's ClusterRole must
// match (test/helm checks every reporter set).
func ClusterRoleRulesFor(reporters []string, remediationOn, claimsByPodWatch bool) []rbacv1.PolicyRule {
	on := func(r string) bool { return slices.Contains(reporters, r) }
	// Every reporter reads its own Node (the shared cache, the drains annotation), the peers
	// watcher the other Nodes of its NVLink domain; the annotation, Volcano and HAMi reporters
	// patch its annotations.
	rules := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}}}
	if on(config.ReporterCondition) {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}})
	}
	if on(config.ReporterDeviceTaint) || on(config.ReporterClaimStatus) {
		// Finding each GPU's DRA device by its UUID attribute.
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch"}})
	}
	if on(config.ReporterDeviceTaint) {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"devicetaintrules"}, Verbs: []string{"get", "list", "create", "update", "delete"}})
	}
	switch {
	case on(config.ReporterClaimStatus) && claimsByPodWatch:
		// claimstatus with agent.claimStatus.podWatch watches the pods bound to the node
		// (selected by spec.nodeName; RBAC cannot confine it to them).
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "watch"}})
	case remediationOn:
		// Remediation lists the pods bound to the node: their claims (who holds a GPU) and the
		// GPU operator's components.
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}})
	}
	if on(config.ReporterClaimStatus) || remediationOn {
		// The claims of the node's pods, each read by name (claimstatus finds them through the
		// kubelet's pod-resources API; RBAC cannot confine a get to one node's claims).
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}})
	}
	if on(config.ReporterClaimStatus) {
		rules = append(rules,
			rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
			// The API server's per-driver check for status.devices: only for claims allocated on
			// the agent's own node (its token is bound to a pod there), only for the GPU driver.
			rbacv1.PolicyRule{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, Verbs: []string{"associated-node:patch"}, ResourceNames: []string{config.DefaultDriverName}})
	}
	return rules
}

// ClusterRoleRules are the agent's cluster-wide rules with every reporter, remediation and the
// claimstatus pod watch on: what the e2e tests grant the agents they run.
func ClusterRoleRules() []rbacv1.PolicyRule {
	return ClusterRoleRulesFor(config.KnownReporters(), true, true)
}

// EventsNamespace is where every Event the agent writes goes: they are all about its Node, and
// Events about cluster-scoped objects live in the default namespace.
const EventsNamespace = "default"

// EventsRoleRules are what the agent needs in EventsNamespace (a Role, so that it cannot write
// Events into any other namespace).
func EventsRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}}}
}

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
// taking slots by creating Leases (create cannot be limited by name: the admission policy lets an
// agent create only slot Leases that name its own node). Agents never change a breaker slot; they
// delete only a domain slot they took for a GPU that the cluster's budget then refused (the
// admission policy: only their own node's); the breaker controller deletes those that stopped
// counting.
func BreakerRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "create", "delete"}},
	}
}

// HeartbeatRoleRules are what the agent needs in its namespace (a Role) for its heartbeat: its
// Lease (gpuhealthv1.HeartbeatLeaseName), read, created and renewed; the admission policy
// confines each agent to its own node's.
func HeartbeatRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}
}

// RemediationRoleRules are the permissions remediation needs in its namespace (a Role) with at
// most maxConcurrent repairs at once: its slots (Leases), which it deletes by name when a repair
// ends (the admission policy: only its own node's).
func RemediationRoleRules(maxConcurrent int) []rbacv1.PolicyRule {
	names := make([]string, maxConcurrent)
	for k := range names {
		names[k] = remediation.SlotName(k)
	}
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"delete"}, ResourceNames: names},
	}
}

// RecordsClusterRoleRules are what the agent needs with fleet.repeatOffender: reading, by name,
// the GPURecords of its GPUs' serials when it starts. No list or watch (it reads only the records
// it can name), and no write: records are the breaker controller's (the admission policy denies
// an agent every write to one as well).
func RecordsClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{gpurecord.Group}, Resources: []string{gpurecord.Resource}, Verbs: []string{"get"}},
	}
}
