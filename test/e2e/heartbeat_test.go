//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestHeartbeatTellsADeadAgentFromAHealthyOne: a real agent confirms its report every period
// although nothing changes, by renewing its heartbeat Lease, with no Node write at all; once it is
// killed, its Lease expires and its last "healthy" goes stale: `gpuhealth status` shows Unknown
// (stale since ...) and the extender keeps GPU pods off the node, saying why, while a node whose
// agent runs stays schedulable.
func TestHeartbeatTellsADeadAgentFromAHealthyOne(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true})
	ctx := t.Context()
	const dead, alive, period = "beat-dead", "beat-alive", 10 * time.Second
	kubeconfig := agentKubeconfig(t, c)
	agents := map[string]*agentProcess{}
	for _, n := range []string{dead, alive} {
		gpuNode(t, c, n, 2)
		agents[n] = startAgent(t, agentSetup{node: n, gpus: 2, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), n+".json"), heartbeat: period})
	}
	renewed := func(ctx context.Context, node string) (time.Time, error) {
		l, err := c.Admin().CoordinationV1().Leases(agentNamespace).Get(ctx, gpuhealthv1.HeartbeatLeaseName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return time.Time{}, nil
		}
		if err != nil || l.Spec.RenewTime == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != node {
			return time.Time{}, err
		}
		return l.Spec.RenewTime.Time, nil
	}
	var first time.Time
	eventually(t, "the first heartbeat", func(ctx context.Context) (bool, string, error) {
		at, err := renewed(ctx, dead)
		first = at
		return !at.IsZero(), fmt.Sprintf("renewed %v", at), err
	})
	before := agents[dead].writes()
	eventuallyWithin(t, 3*period, "the next heartbeat, with nothing changed", func(ctx context.Context) (bool, string, error) {
		at, err := renewed(ctx, dead)
		return at.After(first), fmt.Sprintf("renewed %v (first %v)", at, first), err
	})
	after := agents[dead].writes()
	// No Node write for a heartbeat: the Lease is the heartbeat.
	for _, reporter := range []string{"condition", "annotation"} {
		if d := after[reporter] - before[reporter]; d != 0 {
			t.Errorf("the %s reporter wrote the Node %d times over a heartbeat with nothing changed, want 0", reporter, d)
		}
	}
	if ann, err := nodeAnnotations(ctx, c, dead); err != nil || ann[gpuhealthv1.HeartbeatKey] != "" {
		t.Errorf("the Node carries a heartbeat annotation %q (%v): the heartbeat is the Lease", ann[gpuhealthv1.HeartbeatKey], err)
	}

	agents[dead].kill()
	const staleAfter = 2 * period
	eventuallyWithin(t, 3*staleAfter, "gpuhealth status to call the dead agent's GPUs Unknown", func(context.Context) (bool, string, error) {
		out, stderr, code := gpuhealthCLI(t, "status", "--kubeconfig", c.AdminKubeconfig(), "--stale-after", staleAfter.String())
		if code != 0 {
			return false, "", fmt.Errorf("status: exit %d: %s", code, stderr)
		}
		var deadRows, aliveRows []string
		for _, l := range strings.Split(out, "\n") {
			switch {
			case strings.HasPrefix(l, dead+" "):
				deadRows = append(deadRows, l)
			case strings.HasPrefix(l, alive+" "):
				aliveRows = append(aliveRows, l)
			}
		}
		ok := len(deadRows) == 2 && len(aliveRows) == 2
		for _, l := range deadRows {
			ok = ok && strings.Contains(l, "Unknown (stale since ") && strings.Contains(l, "was Healthy")
		}
		for _, l := range aliveRows {
			ok = ok && strings.Contains(l, " Healthy ") && !strings.Contains(l, "stale")
		}
		return ok, out, nil
	})

	// The extender, against the same API server.
	x := extender.New(c.Admin(), extender.Options{StaleAfter: staleAfter, AgentNamespace: agentNamespace})
	if err := x.Start(ctx); err != nil {
		t.Fatal(err)
	}
	gpuPod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{scheduling.ResourceGPU: *resource.NewQuantity(1, resource.DecimalSI)}}}}}}
	gpuPod.Name, gpuPod.Namespace = "job", "default"
	eventually(t, "the extender to keep GPU pods off the dead agent's node", func(ctx context.Context) (bool, string, error) {
		names := []string{dead, alive}
		res := x.Filter(ctx, &extenderv1.ExtenderArgs{Pod: gpuPod, NodeNames: &names})
		// The test nodes publish no nvidia.com/gpu capacity, so the live node fails too, for that.
		return strings.Contains(res.FailedNodes[dead], "stale since") && !strings.Contains(res.FailedNodes[alive], "stale"),
			fmt.Sprintf("failed %v", res.FailedNodes), nil
	})

	// A heartbeat dated a year ahead (written by hand, or by a node clock far ahead) keeps the
	// dead agent fresh nowhere; the live agent renews its own Lease at its next period.
	future := metav1.NewMicroTime(time.Now().AddDate(1, 0, 0))
	for _, n := range []string{dead, alive} {
		l, err := c.Admin().CoordinationV1().Leases(agentNamespace).Get(ctx, gpuhealthv1.HeartbeatLeaseName(n), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Spec.RenewTime = &future
		if _, err := c.Admin().CoordinationV1().Leases(agentNamespace).Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventuallyWithin(t, 3*staleAfter, "a heartbeat in the future: stale for the dead agent, renewed by the live one", func(ctx context.Context) (bool, string, error) {
		out, stderr, code := gpuhealthCLI(t, "status", "--kubeconfig", c.AdminKubeconfig(), "--stale-after", staleAfter.String())
		if code != 0 {
			return false, "", fmt.Errorf("status: exit %d: %s", code, stderr)
		}
		names := []string{dead, alive}
		res := x.Filter(ctx, &extenderv1.ExtenderArgs{Pod: gpuPod, NodeNames: &names})
		at, err := renewed(ctx, alive)
		if err != nil {
			return false, "", err
		}
		rewritten := at.Before(future.Time)
		return strings.Contains(out, "Unknown (heartbeat in the future: ") && strings.Contains(res.FailedNodes[dead], "is in the future") && rewritten,
			fmt.Sprintf("%s\nfailed %v\nlive node's heartbeat %v", out, res.FailedNodes, at), nil
	})
}
