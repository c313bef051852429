//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
	"github.com/gpuhealth/gpuhealth/test/helm"
)

const evictPolicy = "gpuhealth-agent-evict-own-node"

// TestHelmChartConfinesEvictionsToTheAgentsNode: with agent.eviction on, the chart's RBAC lets
// the agent evict pods, and its policy lets an agent whose token is bound to a pod on node A
// evict only pods bound to A: never B's, never with a token bound to no node. Proven on the real
// API server with tokens minted as the kubelet mints them, through the agent's own client
// (kube.Clientset.Evict) and client-go's.
func TestHelmChartConfinesEvictionsToTheAgentsNode(t *testing.T) {
	t.Parallel()
	manifest := renderChart(t, helm.Options{Release: helmRelease, Namespace: helmNamespace, Set: []string{"config.agent.eviction.enabled=true"}})
	c := controlplane.StartT(t, controlplane.Options{
		DisableScheduler: true,
		Controllers:      []string{"serviceaccount", "validatingadmissionpolicy-status-controller"},
	})
	ctx := t.Context()
	admin := c.Admin()
	const nodeA, nodeB, workloads = "evict-node-a", "evict-node-b", "workloads"
	gpuNode(t, c, nodeA, 1)
	gpuNode(t, c, nodeB, 1)
	for _, ns := range []string{helmNamespace, workloads} {
		if _, err := c.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	applyManifest(t, c, manifest)
	waitPolicyTypeChecked(t, c, evictPolicy)

	pod := func(name, node string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if _, err := admin.CoreV1().Pods(workloads).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod("on-a", nodeA)
	pod("on-a-too", nodeA)
	pod("on-b", nodeB)
	t.Cleanup(func() {
		if t.Failed() {
			pods, _ := admin.CoreV1().Pods(workloads).List(context.Background(), metav1.ListOptions{})
			for _, p := range pods.Items {
				t.Logf("pod %s/%s on %q, deleting: %v", p.Namespace, p.Name, p.Spec.NodeName, p.DeletionTimestamp != nil)
			}
		}
	})

	cfgA := boundAgentConfig(t, c, nodeA)
	asA := clientFor(t, cfgA)
	unbound, err := c.ServiceAccountConfig(ctx, helmNamespace, helmAgentSA)
	if err != nil {
		t.Fatal(err)
	}
	asUnbound := clientFor(t, unbound)
	evict := func(cs kubernetes.Interface, name string, dryRun bool) func(context.Context) error {
		return func(ctx context.Context) error {
			ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: name}}
			if dryRun {
				ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
			}
			return cs.PolicyV1().Evictions(workloads).Evict(ctx, ev)
		}
	}
	denied := func(err error) bool {
		return (apierrors.IsForbidden(err) || apierrors.IsInvalid(err)) && strings.Contains(err.Error(), evictPolicy)
	}
	// The policy takes effect once the API server's informers have it and its params; a dry run
	// cannot delete the pod while we wait.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, pollTimeout, true, func(ctx context.Context) (bool, error) {
		last = evict(asA, "on-b", true)(ctx)
		return denied(last), nil
	}); err != nil {
		t.Fatalf("waiting for the eviction policy: %v (last: %v)", err, last)
	}

	for _, tc := range []struct {
		name    string
		request func(context.Context) error
		denied  string
	}{
		{"another node's pod", evict(asA, "on-b", false), "may evict only pods bound to its node"},
		{"a token bound to no node", evict(asUnbound, "on-a", false), "not bound to a Node"},
		{"a pod that does not exist", evict(asA, "nobody", false), ""},
		{"its own node's pod, client-go", evict(asA, "on-a", false), "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.request(ctx)
			switch tc.denied {
			case "-":
				if err != nil {
					t.Fatalf("eviction refused: %v", err)
				}
			case "":
				// Nothing to evict: refused one way or another (no such pod, or no param).
				if err == nil {
					t.Fatal("evicting a pod that does not exist succeeded")
				}
			default:
				if !denied(err) || !strings.Contains(err.Error(), tc.denied) {
					t.Fatalf("error %v, want the policy's denial saying %q", err, tc.denied)
				}
			}
		})
	}

	// The agent's own client, as the evictor calls it.
	kc, err := kube.NewForConfig(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: "on-b"}}); !denied(err) {
		t.Fatalf("kube.Clientset.Evict of B's pod: %v, want the policy's denial", err)
	}
	if err := kc.Evict(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: workloads, Name: "on-a-too"}}); err != nil {
		t.Fatalf("kube.Clientset.Evict of A's pod: %v", err)
	}
	if p, err := admin.CoreV1().Pods(workloads).Get(ctx, "on-b", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("B's pod after A's attempts: %v, deleting %v", err, p.DeletionTimestamp)
	}
}
