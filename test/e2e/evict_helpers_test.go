//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// evictionRBAC gives the agents' ServiceAccount exactly agent.EvictionClusterRoleRules, in a
// ClusterRole of its own as the chart does (gpuhealth-agent-eviction).
func evictionRBAC(t *testing.T, c *controlplane.Cluster) {
	t.Helper()
	ctx := t.Context()
	const name = "gpuhealth-agent-eviction"
	rbac := c.Admin().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: agent.EvictionClusterRoleRules()}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: agentNamespace, Name: "gpuhealth-agent"}},
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// evictionConfig is agent.eviction on, looked at again every second. agentSetup.topConfig is
// appended right after the agent section (agentConfig ends with it), so its lines are indented
// into that section.
func evictionConfig(podResourcesSocket string) string {
	return fmt.Sprintf("  eviction:\n    enabled: true\n    retry: 1s\n    podResourcesSocket: %q\n", podResourcesSocket)
}

// evictionEvents returns the messages of the Events with reason about the object called name
// in namespace ns (a Node's are in the default namespace).
func evictionEvents(ctx context.Context, c *controlplane.Cluster, ns, name, reason string) ([]string, error) {
	list, err := c.Admin().CoreV1().Events(ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.name", name),
			fields.OneTermEqualSelector("reason", reason)).String(),
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Message)
	}
	return out, nil
}

// waitEvent waits for an Event with reason about ns/name whose message contains want.
func waitEvent(t *testing.T, c *controlplane.Cluster, ns, name, reason, want string) string {
	t.Helper()
	var found string
	eventually(t, fmt.Sprintf("a %s Event on %s/%s saying %q", reason, ns, name, want), func(ctx context.Context) (bool, string, error) {
		msgs, err := evictionEvents(ctx, c, ns, name, reason)
		i := slices.IndexFunc(msgs, func(m string) bool { return strings.Contains(m, want) })
		if i >= 0 {
			found = msgs[i]
		}
		return i >= 0, fmt.Sprint(msgs), err
	})
	return found
}

// waitPodGone waits until the pod with that UID no longer exists (a successor of the same name
// does not count).
func waitPodGone(t *testing.T, c *controlplane.Cluster, ns, name string, uid types.UID) {
	t.Helper()
	eventually(t, "pod "+ns+"/"+name+" evicted and gone", func(ctx context.Context) (bool, string, error) {
		got, err := c.Admin().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "deleted", nil
		}
		if err != nil {
			return false, "", err
		}
		return got.UID != uid, fmt.Sprintf("phase %s, deletionTimestamp %v", got.Status.Phase, got.DeletionTimestamp), nil
	})
}

// assertPodUntouched fails unless the pod still runs with the same UID and nothing deletes it.
func assertPodUntouched(t *testing.T, c *controlplane.Cluster, pod *corev1.Pod) {
	t.Helper()
	got, err := c.Admin().CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
	if got.UID != pod.UID || got.DeletionTimestamp != nil || got.Status.Phase != corev1.PodRunning {
		t.Errorf("pod %s/%s: UID %s (was %s), deletionTimestamp %v, phase %s: want it untouched and Running",
			pod.Namespace, pod.Name, got.UID, pod.UID, got.DeletionTimestamp, got.Status.Phase)
	}
	if msgs, err := evictionEvents(t.Context(), c, pod.Namespace, pod.Name, "GPUEvicted"); err != nil || len(msgs) > 0 {
		t.Errorf("pod %s/%s: GPUEvicted Events %v (%v), want none", pod.Namespace, pod.Name, msgs, err)
	}
}

// pendingEvictions reads the Node's gpuhealth.dev/gpu-evictions annotation.
func pendingEvictions(ctx context.Context, c *controlplane.Cluster, node string) (map[string]gpuhealthv1.GPUEvictions, error) {
	ann, err := nodeAnnotations(ctx, c, node)
	if err != nil {
		return nil, err
	}
	return gpuhealthv1.ParseEvictions(ann[gpuhealthv1.EvictionsKey])
}

// gpuIndex is the index of the simulator's GPU uuid on node (of 8), or -1.
func gpuIndex(node, uuid string) int {
	for i := range 8 {
		if simUUID(node, i) == uuid {
			return i
		}
	}
	return -1
}
