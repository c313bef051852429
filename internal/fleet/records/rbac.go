package records

import (
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

// ControllerClusterRoleRules are what the Controller needs beside the breaker controller's own
// rules (which already watch the Nodes): the GPURecords, watched, created and updated. Never
// deleted: a record outlives its nodes.
func ControllerClusterRoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{gpurecord.Group}, Resources: []string{gpurecord.Resource}, Verbs: []string{"get", "list", "watch", "create", "update"}},
	}
}
