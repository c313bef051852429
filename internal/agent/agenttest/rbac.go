package agenttest

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/agent"
)

// Grant gives the ServiceAccount namespace/account what the chart gives the agent with every
// reporter and remediation on: the ClusterRole agent.ClusterRoleRules, and agent.EventsRoleRules
// in agent.EventsNamespace, both named name, and agent.HeartbeatRoleRules in namespace (name-heartbeat).
// Objects that already exist are left as they are.
func Grant(ctx context.Context, admin kubernetes.Interface, name, namespace, account string) error {
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: account}}
	create := func(what string, err error) error {
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %s %s: %w", what, name, err)
		}
		return nil
	}
	rbac := admin.RbacV1()
	_, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: agent.ClusterRoleRules()}, metav1.CreateOptions{})
	if err := create("ClusterRole", err); err != nil {
		return err
	}
	_, err = rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err := create("ClusterRoleBinding", err); err != nil {
		return err
	}
	_, err = rbac.Roles(agent.EventsNamespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agent.EventsNamespace, Name: name}, Rules: agent.EventsRoleRules()}, metav1.CreateOptions{})
	if err := create("Role", err); err != nil {
		return err
	}
	_, err = rbac.RoleBindings(agent.EventsNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: agent.EventsNamespace, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	if err := create("RoleBinding", err); err != nil {
		return err
	}
	// The heartbeat Lease, in the agent's namespace.
	heartbeat := name + "-heartbeat"
	_, err = rbac.Roles(namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: heartbeat}, Rules: agent.HeartbeatRoleRules()}, metav1.CreateOptions{})
	if err := create("Role", err); err != nil {
		return err
	}
	_, err = rbac.RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: heartbeat},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: heartbeat},
		Subjects:   subjects,
	}, metav1.CreateOptions{})
	return create("RoleBinding", err)
}
