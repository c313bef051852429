//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// clearReturnsAt is when the scenario's fault happens again: long enough after the first for the
// clear to be seen everywhere first, on a slow machine too.
const clearReturnsAt = 40 * time.Second

// TestClearAFalsePositive clears a condition with the CLI as an operator would, with no more
// rights than patching Nodes: the agent ends it in every sink, an Event names who and why, and
// the request leaves the Node; when the fault happens again it is raised again. Bad requests
// change nothing, a user who may not patch Nodes cannot clear, and a malformed annotation is
// left for a person to fix.
func TestClearAFalsePositive(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	ctx := t.Context()
	admin := c.Admin()
	const node = "clear-node"
	uuids := gpuNode(t, c, node, 2)
	operator := userKubeconfig(t, c, "operator-olga", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
	})
	viewer := userKubeconfig(t, c, "viewer-vic", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list"}},
	})
	started := time.Now()
	startAgent(t, agentSetup{
		node: node, gpus: 2, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: fmt.Sprintf("events:\n  - {at: 1s, gpu: 1, xid: 48}\n  - {at: %s, gpu: 1, xid: 48}\n", clearReturnsAt),
	})

	// sinks says what every sink the test reads reports for GPU 1, and whether that is unhealthy
	// with XID 48 (want true) or healthy (want false).
	sinks := func(want bool) func(ctx context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			ann, err := nodeAnnotations(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			summaries, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
			if err != nil {
				return false, "", err
			}
			rs, err := rules(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			cond, err := nodeCondition(ctx, c, node, corev1.NodeConditionType(gpuhealthv1.ConditionGPUUnhealthy))
			if err != nil {
				return false, "", err
			}
			s := summaries[uuids[1]]
			state := fmt.Sprintf("health=%s reasons=%v volcano=%q rules=%v condition=%s", s.Health, s.Reasons, ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs), cond.Status)
			if want {
				return s.Health == "Unhealthy" && strings.Contains(strings.Join(s.Reasons, ","), "XID48") &&
					ann[gpuhealthv1.UnhealthyIDsKey] == "1" && len(rs) == 1 && cond.Status == corev1.ConditionTrue, state, nil
			}
			_, volcano := ann[gpuhealthv1.UnhealthyIDsKey]
			return s.Health == "Healthy" && len(s.Reasons) == 0 && !volcano && len(rs) == 0 && cond.Status == corev1.ConditionFalse, state, nil
		}
	}
	eventually(t, "XID 48 on GPU 1 in every sink", sinks(true))

	// Bad requests: exit 2 naming the problem, nothing written.
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a node that does not exist", []string{"clear", "no-such-node", "1", "--reason", "r"}, `node "no-such-node" not found`},
		{"a GPU the agent does not report", []string{"clear", node, "7", "--reason", "r"}, `no GPU "7"`},
		{"no reason", []string{"clear", node, "1", "XID48"}, "--reason"},
		{"a drain", []string{"clear", node, "1", "AdminDrain", "--reason", "r"}, "gpuhealth undrain"},
	} {
		_, stderr, code := gpuhealthCLI(t, append(tc.args, "--kubeconfig", operator)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, %q; want exit 2 and %q", tc.name, code, stderr, tc.want)
		}
	}
	// Someone who may read Nodes but not patch them cannot clear.
	if _, stderr, code := gpuhealthCLI(t, "clear", node, "1", "XID48", "--reason", "r", "--kubeconfig", viewer); code != 1 || !strings.Contains(stderr, "forbidden") {
		t.Errorf("clear by a user who may not patch Nodes: exit %d, %q; want exit 1, forbidden", code, stderr)
	}
	// A malformed annotation: the CLI refuses to build on it, the agent applies nothing from it,
	// warns, and leaves it for a person to fix.
	malformed := `{"` + uuids[1] + `":[{"index":1,"condition":"XID48","reason":"fine"},{"index":1,"condition":"XID 48","reason":"typo"}]}`
	mergePatchNode(t, admin, node, map[string]any{gpuhealthv1.ClearsKey: malformed})
	if _, stderr, code := gpuhealthCLI(t, "clear", node, "1", "--reason", "r", "--kubeconfig", operator); code != 1 || !strings.Contains(stderr, "fix or remove the annotation by hand") {
		t.Errorf("clear over a malformed annotation: exit %d, %q", code, stderr)
	}
	eventually(t, "the agent's Warning about the malformed annotation", func(ctx context.Context) (bool, string, error) {
		e, err := nodeEvents(ctx, c, node, gpuhealthv1.EventMalformedClears)
		return len(e) == 1, fmt.Sprint(len(e), " events"), err
	})
	if ann, err := nodeAnnotations(ctx, c, node); err != nil || ann[gpuhealthv1.ClearsKey] != malformed {
		t.Fatalf("the malformed annotation was changed: %q %v", ann[gpuhealthv1.ClearsKey], err)
	}
	// Not even the request that is fine was applied (the single clear Event at the end says so
	// too).
	if ok, state, err := sinks(true)(ctx); !ok || err != nil {
		t.Fatalf("GPU 1 changed although nothing was to be cleared: %s %v", state, err)
	}
	mergePatchNode(t, admin, node, map[string]any{gpuhealthv1.ClearsKey: nil})

	// A request that matches nothing: the agent says so, the command fails with its Warning.
	if _, stderr, code := gpuhealthCLI(t, "clear", node, "0", "XID48", "--reason", "wrong card", "--wait", "60s", "--kubeconfig", operator); code != 1 ||
		!strings.Contains(stderr, "cleared nothing on GPU 0 ("+uuids[0]+"): no condition XID48 in effect") {
		t.Errorf("clear of a healthy GPU: exit %d, %q; want exit 1 with the agent's Warning", code, stderr)
	}

	// The clear, by the reason gpuhealth status shows, as the operator, who the API server names.
	out, stderr, code := gpuhealthCLI(t, "clear", node, "1", "XID48", "--reason", "bad test batch, ticket 30", "--wait", "60s", "--kubeconfig", operator)
	if code != 0 || !strings.Contains(out, "gpuhealth cleared XID48 on GPU 1 ("+uuids[1]+"), requested by operator-olga at ") ||
		!strings.Contains(out, ": bad test batch, ticket 30; now Healthy") {
		t.Fatalf("clear: exit %d, stdout %q, stderr %q", code, out, stderr)
	}
	t.Logf("gpuhealth clear: %s", strings.TrimSpace(out))
	eventually(t, "GPU 1 healthy in every sink", sinks(false))
	if since := time.Since(started); since >= clearReturnsAt {
		t.Fatalf("the clear was seen %v after the agent started, after the fault returned (%v): the checks above prove nothing", since, clearReturnsAt)
	}
	events, err := nodeEvents(ctx, c, node, gpuhealthv1.EventConditionsCleared)
	if err != nil || len(events) != 1 || events[0].Type != corev1.EventTypeNormal ||
		!strings.Contains(events[0].Message, "requested by operator-olga") || !strings.Contains(events[0].Message, "bad test batch, ticket 30") {
		t.Errorf("the clear's Event: %+v %v; want one Normal naming operator-olga and the reason", events, err)
	}
	if ann, err := nodeAnnotations(ctx, c, node); err != nil || ann[gpuhealthv1.ClearsKey] != "" {
		t.Errorf("the request is still on the Node: %q %v", ann[gpuhealthv1.ClearsKey], err)
	}

	// The same fault again: raised again, as any other.
	eventuallyWithin(t, clearReturnsAt+pollTimeout, "XID 48 raised again when it returns", sinks(true))
	if events, err := nodeEvents(ctx, c, node, gpuhealthv1.EventConditionsCleared); err != nil || len(events) != 1 {
		t.Errorf("%d clear Events after the fault returned, %v; want the one", len(events), err)
	}

	// A request written before the fault returned (one left in a manifest, re-applied by a
	// GitOps tool) clears nothing of it; a request without "at" is refused whole.
	stale := fmt.Sprintf(`{%q:[{"index":1,"condition":"XID48","reason":"re-applied manifest","by":"gitops","at":%q}]}`,
		uuids[1], started.UTC().Format(time.RFC3339))
	mergePatchNode(t, admin, node, map[string]any{gpuhealthv1.ClearsKey: stale})
	eventually(t, "the stale request applied, removed, and its Warning names the newer fault", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		events, err := nodeEvents(ctx, c, node, gpuhealthv1.EventClearMatchedNothing)
		if err != nil {
			return false, "", err
		}
		said := slices.ContainsFunc(events, func(e corev1.Event) bool {
			return strings.Contains(e.Message, "re-applied manifest") && strings.Contains(e.Message, "XID48 raised after the request was written")
		})
		_, pending := ann[gpuhealthv1.ClearsKey]
		return !pending && said, fmt.Sprintf("pending=%v warnings=%d", pending, len(events)), nil
	})
	eventually(t, "GPU 1 still unhealthy in every sink after the stale request", sinks(true))
	undated := fmt.Sprintf(`{%q:[{"index":1,"condition":"XID48","reason":"no date","by":"gitops"}]}`, uuids[1])
	mergePatchNode(t, admin, node, map[string]any{gpuhealthv1.ClearsKey: undated})
	eventually(t, "the undated request refused and left on the Node", func(ctx context.Context) (bool, string, error) {
		events, err := nodeEvents(ctx, c, node, gpuhealthv1.EventMalformedClears)
		if err != nil {
			return false, "", err
		}
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		refused := slices.ContainsFunc(events, func(e corev1.Event) bool { return strings.Contains(e.Message, `no "at"`) })
		return refused && ann[gpuhealthv1.ClearsKey] == undated, fmt.Sprintf("malformed warnings=%d", len(events)), nil
	})
	eventually(t, "GPU 1 still unhealthy in every sink after the undated request", sinks(true))
}

// userKubeconfig writes a kubeconfig for user, who may do what rules allow and no more.
func userKubeconfig(t *testing.T, c *controlplane.Cluster, user string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	ctx := t.Context()
	admin := c.Admin()
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), user+".kubeconfig")
	if err := c.WriteKubeconfig(path, cfg); err != nil {
		t.Fatal(err)
	}
	return path
}

// nodeEvents returns the Events about node with reason.
func nodeEvents(ctx context.Context, c *controlplane.Cluster, node, reason string) ([]corev1.Event, error) {
	list, err := c.Admin().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.kind=Node,involvedObject.name=" + node + ",reason=" + reason,
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}
