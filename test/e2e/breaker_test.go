//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestCircuitBreakerStopsAMassEviction fails half of a small cluster's GPUs at once with a fault
// that asks for eviction, NoExecute enabled, and the circuit breaker allowing a quarter: exactly
// the budget gets NoExecute and their pods are evicted by the real controller-manager; every
// other sick GPU is tainted None, loudly, and its pod stays; after `gpuhealth breaker ack` the
// held GPUs get their effect too.
func TestCircuitBreakerStopsAMassEviction(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	const ns, gpus = "breaker", 4
	nodes := []string{"breaker-0", "breaker-1", "breaker-2", "breaker-3"}
	uuids := map[string][]string{}
	for _, n := range nodes {
		uuids[n] = gpuNode(t, c, n, gpus)
	}
	if _, err := c.Admin().ResourceV1().DeviceClasses().Create(ctx, controlplane.GPUDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	kubeconfigs := map[string]string{}
	for _, n := range nodes {
		kubeconfigs[n] = agentKubeconfigOnNode(t, c, n)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-breaker"}, Rules: agent.BreakerRoleRules()}
	if _, err := c.Admin().RbacV1().Roles(agentNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "gpuhealth-agent-breaker"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNamespace, Name: "gpuhealth-agent"}},
	}
	if _, err := c.Admin().RbacV1().RoleBindings(agentNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	controllerMetrics := startBreakerController(t, c)
	// Two jobs per node, on GPUs 0 and 1: the ones about to fail.
	var jobs []string
	for _, n := range nodes {
		c.StartKubeletT(t, n)
		for i := range 2 {
			name := fmt.Sprintf("%s-job-%d", n, i)
			podWithClaim(t, c, pinnedClaim(ns, name, uuids[n][i], ""), n)
			jobs = append(jobs, name)
		}
	}
	for _, j := range jobs {
		dev := "gpu-0"
		if strings.HasSuffix(j, "-1") {
			dev = "gpu-1"
		}
		waitAllocated(t, c, ns, j, dev)
	}

	// 8 of the 16 GPUs fall off the bus at once; a quarter (4) may be evicted.
	for _, n := range nodes {
		startAgent(t, agentSetup{node: n, gpus: gpus, kubeconfig: kubeconfigs[n], checkpoint: filepath.Join(t.TempDir(), n+".ckpt"),
			noExecute: true, breakerFraction: 0.25,
			scenario: "events:\n  - {at: 12s, gpu: 0, xid: 79}\n  - {at: 12s, gpu: 1, xid: 79}\n"})
	}
	effects := func(ctx context.Context) (map[resourcev1.DeviceTaintEffect]int, error) {
		list, err := c.Admin().ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{LabelSelector: devicetaint.ManagedByLabel + "=" + devicetaint.ManagedBy})
		if err != nil {
			return nil, err
		}
		out := map[resourcev1.DeviceTaintEffect]int{}
		for _, r := range list.Items {
			out[r.Spec.Taint.Effect]++
		}
		return out, nil
	}
	remaining := func(ctx context.Context) ([]string, error) {
		var left []string
		for _, j := range jobs {
			_, err := c.Admin().CoreV1().Pods(ns).Get(ctx, j, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			left = append(left, j)
		}
		return left, nil
	}

	eventually(t, "the breaker controller counts the cluster's 16 GPUs", func(ctx context.Context) (bool, string, error) {
		cm, err := c.Admin().CoreV1().ConfigMaps(agentNamespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no ConfigMap yet", nil
		}
		if err != nil {
			return false, "", err
		}
		n, _ := breaker.ParseState(cm)
		return n == len(nodes)*gpus, fmt.Sprintf("count %d", n), nil
	})
	eventually(t, "the controller exports the count and is healthy", func(context.Context) (bool, string, error) {
		body, err := httpGet(controllerMetrics + "/metrics")
		if err != nil {
			return false, err.Error(), nil
		}
		health, err := httpGet(controllerMetrics + "/healthz")
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(body, "gpuhealth_breaker_cluster_gpus 16") && strings.Contains(body, "gpuhealth_breaker_leader 1") && health == "ok",
			"healthz " + health, nil
	})
	eventually(t, "the wave is reported on every node", func(ctx context.Context) (bool, string, error) {
		var ids []string
		for _, n := range nodes {
			ann, err := nodeAnnotations(ctx, c, n)
			if err != nil {
				return false, "", err
			}
			ids = append(ids, ann[gpuhealthv1.UnhealthyIDsKey])
		}
		return slices.Equal(ids, []string{"0,1", "0,1", "0,1", "0,1"}), fmt.Sprint(ids), nil
	})
	eventually(t, "the budget gets NoExecute, the rest None, and only the budget's pods go", func(ctx context.Context) (bool, string, error) {
		e, err := effects(ctx)
		if err != nil {
			return false, "", err
		}
		left, err := remaining(ctx)
		if err != nil {
			return false, "", err
		}
		if e[resourcev1.DeviceTaintEffectNoExecute] > 4 {
			return false, "", fmt.Errorf("%d GPUs got NoExecute past a budget of 4", e[resourcev1.DeviceTaintEffectNoExecute])
		}
		return e[resourcev1.DeviceTaintEffectNoExecute] == 4 && e[resourcev1.DeviceTaintEffectNone] == 4 && len(left) == 4,
			fmt.Sprintf("effects=%v pods left=%v", e, left), nil
	})
	out, stderr, code := gpuhealthCLI(t, "breaker", "status", "--kubeconfig", c.AdminKubeconfig(), "-n", agentNamespace)
	if code != 0 || !strings.Contains(out, "cluster GPUs: 16") || strings.Count(out, " yes\n") != 4 {
		t.Errorf("breaker status: exit %d, want the count and 4 slots that count:\n%s%s", code, out, stderr)
	}
	eventually(t, "held GPUs are reported loudly", func(ctx context.Context) (bool, string, error) {
		open := 0
		for _, n := range nodes {
			cond, err := nodeCondition(ctx, c, n, nodecondition.BreakerType)
			if err != nil {
				return false, "", err
			}
			if cond.Status == corev1.ConditionTrue {
				open++
			}
		}
		evs, err := c.Admin().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "reason=CircuitBreakerOpen"})
		if err != nil {
			return false, "", err
		}
		return open > 0 && len(evs.Items) > 0, fmt.Sprintf("%d nodes with the condition True, %d events", open, len(evs.Items)), nil
	})

	if out, stderr, code := gpuhealthCLI(t, "breaker", "ack", "--kubeconfig", c.AdminKubeconfig(), "-n", agentNamespace); code != 0 {
		t.Fatalf("breaker ack: exit %d, %q %q", code, out, stderr)
	}
	eventually(t, "after the acknowledgement every sick GPU gets NoExecute and its pod goes", func(ctx context.Context) (bool, string, error) {
		e, err := effects(ctx)
		if err != nil {
			return false, "", err
		}
		left, err := remaining(ctx)
		if err != nil {
			return false, "", err
		}
		return e[resourcev1.DeviceTaintEffectNoExecute] == 8 && len(left) == 0, fmt.Sprintf("effects=%v pods left=%v", e, left), nil
	})
}

// startBreakerController runs `gpuhealth breaker controller` as its own least-privilege
// ServiceAccount (breaker.ControllerClusterRoleRules and ControllerRoleRules, as the chart grants)
// until the test ends, and returns the base URL of its /metrics and /healthz.
func startBreakerController(t *testing.T, c *controlplane.Cluster) string {
	t.Helper()
	return startBreakerControllerWith(t, c, nil)
}

// startBreakerControllerWith is startBreakerController with more flags; --agent-silent-taint
// grants breaker.SilentTaintClusterRoleRules too, as the chart does.
func startBreakerControllerWith(t *testing.T, c *controlplane.Cluster, args []string) string {
	t.Helper()
	ctx := t.Context()
	const name = "gpuhealth-breaker-controller"
	admin := c.Admin()
	rules := breaker.ControllerClusterRoleRules()
	if slices.Contains(args, "--agent-silent-taint") {
		rules = append(rules, breaker.SilentTaintClusterRoleRules()...)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subjects := []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: agentNamespace, Name: name}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(agentNamespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: name}, Rules: breaker.ControllerRoleRules()}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(agentNamespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: name},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subjects}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := c.ServiceAccountConfig(ctx, agentNamespace, name)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "breaker-controller.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "breaker-controller.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(gpuhealthBinary(t), append([]string{"breaker", "controller", "--kubeconfig", kubeconfig, "-n", agentNamespace, "--metrics-address", addr, "-v", "2"}, args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("breaker controller log:\n%s", tail(string(b), 40))
		}
	})
	return "http://" + addr
}
