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
	"k8s.io/apimachinery/pkg/api/resource"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestHeartbeatTellsADeadAgentFromAHealthyOne: a real agent confirms its report every period
// although nothing changes, in one write (the condition's lastHeartbeatTime and the heartbeat
// annotation together, through nodes/status); once it is killed, its last "healthy" goes stale:
// `gpuhealth status` shows Unknown (stale since ...) and the extender keeps GPU pods off the node,
// saying why, while a node whose agent runs stays schedulable.
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
	beatOf := func(ctx context.Context, node string) (annotation, condition time.Time, err error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return time.Time{}, time.Time{}, err
		}
		cond, err := nodeCondition(ctx, c, node, nodecondition.Type)
		if err != nil {
			return time.Time{}, time.Time{}, err
		}
		at, _ := gpuhealthv1.ParseHeartbeat(ann[gpuhealthv1.HeartbeatKey])
		return at, cond.LastHeartbeatTime.Time, nil
	}
	var first time.Time
	eventually(t, "the first heartbeat", func(ctx context.Context) (bool, string, error) {
		a, cnd, err := beatOf(ctx, dead)
		first = a
		return !a.IsZero() && a.Equal(cnd.Truncate(time.Second)), fmt.Sprintf("annotation %v, condition %v", a, cnd), err
	})
	before := agents[dead].writes()
	eventuallyWithin(t, 3*period, "the next heartbeat, with nothing changed", func(ctx context.Context) (bool, string, error) {
		a, cnd, err := beatOf(ctx, dead)
		return a.After(first) && a.Equal(cnd.Truncate(time.Second)), fmt.Sprintf("annotation %v, condition %v (first %v)", a, cnd, first), err
	})
	after := agents[dead].writes()
	// One write per heartbeat: the condition reporter's patch carries the annotation too.
	if d := after["condition"] - before["condition"]; d < 1 || d > 2 {
		t.Errorf("the condition reporter wrote %d times over one heartbeat, want 1 (2 if the scrape straddled one)", d)
	}
	if after["annotation"] != before["annotation"] {
		t.Errorf("the annotation reporter wrote %d times for heartbeats; the heartbeat rides the condition's write", after["annotation"]-before["annotation"])
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
	x := extender.New(c.Admin(), extender.Options{StaleAfter: staleAfter})
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

	// A heartbeat dated a year ahead (by hand, or a node clock far ahead) keeps the dead agent
	// fresh nowhere; the live agent rewrites one on its own node at its next sync.
	future := gpuhealthv1.FormatHeartbeat(time.Now().AddDate(1, 0, 0))
	for _, n := range []string{dead, alive} {
		mergePatchNode(t, c.Admin(), n, map[string]any{gpuhealthv1.HeartbeatKey: future})
	}
	eventuallyWithin(t, 3*staleAfter, "a heartbeat in the future: stale for the dead agent, rewritten by the live one", func(ctx context.Context) (bool, string, error) {
		out, stderr, code := gpuhealthCLI(t, "status", "--kubeconfig", c.AdminKubeconfig(), "--stale-after", staleAfter.String())
		if code != 0 {
			return false, "", fmt.Errorf("status: exit %d: %s", code, stderr)
		}
		names := []string{dead, alive}
		res := x.Filter(ctx, &extenderv1.ExtenderArgs{Pod: gpuPod, NodeNames: &names})
		ann, err := nodeAnnotations(ctx, c, alive)
		if err != nil {
			return false, "", err
		}
		rewritten := ann[gpuhealthv1.HeartbeatKey] != future
		return strings.Contains(out, "Unknown (heartbeat in the future: ") && strings.Contains(res.FailedNodes[dead], "is in the future") && rewritten,
			fmt.Sprintf("%s\nfailed %v\nlive node's heartbeat %s", out, res.FailedNodes, ann[gpuhealthv1.HeartbeatKey]), nil
	})
}
