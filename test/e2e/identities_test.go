//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestIdentities checks that the harness's identities authenticate as who they claim and that
// RBAC, the Node authorizer and NodeRestriction are really enforced.
func TestIdentities(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true})
	ctx := t.Context()
	admin := c.Admin()
	const ns = "identities"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}

	t.Run("component identities", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			config func() (*kubernetes.Clientset, error)
			want   string
		}{
			{"admin", func() (*kubernetes.Clientset, error) { return c.Admin(), nil }, controlplane.AdminUser},
			{"scheduler", func() (*kubernetes.Clientset, error) {
				cfg, err := c.SchedulerConfig()
				if err != nil {
					return nil, err
				}
				return kubernetes.NewForConfig(cfg)
			}, controlplane.SchedulerUser},
			{"controller-manager", func() (*kubernetes.Clientset, error) {
				cfg, err := c.ControllerManagerConfig()
				if err != nil {
					return nil, err
				}
				return kubernetes.NewForConfig(cfg)
			}, controlplane.ControllerManagerUser},
			{"service account", func() (*kubernetes.Clientset, error) {
				return c.ServiceAccountClient(ctx, ns, "reporter")
			}, "system:serviceaccount:" + ns + ":reporter"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				cs, err := tc.config()
				if err != nil {
					t.Fatal(err)
				}
				if got := whoami(ctx, t, cs); got != tc.want {
					t.Errorf("authenticated as %q, want %q", got, tc.want)
				}
			})
		}
	})

	t.Run("RBAC applies to users and ServiceAccounts", func(t *testing.T) {
		alice, err := c.UserClient("alice", "gpu-team")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alice.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("alice lists pods without a binding: err = %v, want Forbidden", err)
		}
		// "view" is an aggregated ClusterRole: its rules only exist once the controller-manager's
		// clusterrole-aggregation-controller has filled them in.
		bindGroup(ctx, t, admin, ns, "gpu-team-view", "gpu-team", "view")
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
			_, err := alice.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("alice (group gpu-team bound to view) cannot list pods: %v", err)
		}

		sa, err := c.ServiceAccountClient(ctx, ns, "reporter")
		if err != nil {
			t.Fatal(err)
		}
		rule := controlplane.GPUDeviceTaintRule("sa-rule", "node-x", "gpu-0",
			resourcev1.DeviceTaint{Key: taintKeyRule, Effect: resourcev1.DeviceTaintEffectNone})
		if _, err := sa.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("ServiceAccount creates a DeviceTaintRule without RBAC: err = %v, want Forbidden", err)
		}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "devicetaintrule-writer"},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{resourcev1.GroupName}, Resources: []string{"devicetaintrules"},
				Verbs: []string{"create", "get"},
			}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ClusterRole: %v", err)
		}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "reporter-devicetaintrule-writer"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "reporter"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "devicetaintrule-writer"},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ClusterRoleBinding: %v", err)
		}
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
			_, err := sa.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("bound ServiceAccount cannot create a DeviceTaintRule: %v", err)
		}
	})

	t.Run("a node can change only itself", func(t *testing.T) {
		for _, name := range []string{"node-a", "node-b"} {
			if _, err := c.CreateReadyNode(ctx, name, nil); err != nil {
				t.Fatal(err)
			}
		}
		nodeA, err := c.NodeConfig("node-a")
		if err != nil {
			t.Fatal(err)
		}
		kubeletA, err := kubernetes.NewForConfig(nodeA)
		if err != nil {
			t.Fatal(err)
		}
		if got := whoami(ctx, t, kubeletA); got != "system:node:node-a" {
			t.Errorf("node client authenticated as %q", got)
		}
		own, err := kubeletA.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("node-a reads itself: %v", err)
		}
		own.Labels["example.com/touched"] = "yes"
		if _, err := kubeletA.CoreV1().Nodes().Update(ctx, own, metav1.UpdateOptions{}); err != nil {
			t.Errorf("node-a updates itself: %v", err)
		}
		other, err := admin.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		other.Labels["example.com/touched"] = "yes"
		if _, err := kubeletA.CoreV1().Nodes().Update(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node-a updates node-b: err = %v, want Forbidden", err)
		}
	})
}

// TestAPIServerOnly checks the smallest configuration: no scheduler, no controller-manager.
// Namespaces still get a default ServiceAccount (CreateNamespace makes it), so pods are admitted,
// and they stay unscheduled.
func TestAPIServerOnly(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	if got := len(c.Processes()); got != 2 {
		t.Errorf("%d processes running, want 2 (etcd, kube-apiserver)", got)
	}
	const ns = "bare"
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	pod, err := c.Admin().CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause:3.10"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod without a controller-manager: %v", err)
	}
	if pod.Spec.NodeName != "" {
		t.Errorf("pod bound to %q with no scheduler", pod.Spec.NodeName)
	}
}

func whoami(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SelfSubjectReview: %v", err)
	}
	return review.Status.UserInfo.Username
}

func bindGroup(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name, group, clusterRole string) {
	t.Helper()
	_, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind group %s to %s: %v", group, clusterRole, err)
	}
}
