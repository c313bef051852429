//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAgentJudgesHealthOverTime runs the repeat rules, the node finding and escalation through a
// real agent to the real API server: an XID 13 that comes back on GPU 0, XID 31 on three other
// GPUs at once (a likely software cause: a node-level reason, no GPU made sick by it), and an
// XID 48 on GPU 4 that returns after each of two resets (ReplaceGPU, which a third reset does not
// clear), with GPU 4's history on the gpu-health annotation.
func TestAgentJudgesHealthOverTime(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-over-time"
	uuids := gpuNode(t, c, node, 6)
	startAgent(t, agentSetup{
		node: node, gpus: 6, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: `events:
  - {at: 1s, gpu: 0, xid: 13}
  - {at: 20s, gpu: 0, xid: 13}
  - {at: 40s, gpu: 0, xid: 13}
  - {at: 1s, gpu: 1, xid: 31}
  - {at: 1s, gpu: 2, xid: 31}
  - {at: 1s, gpu: 3, xid: 31}
  - {at: 1s, gpu: 4, xid: 48}
  - {at: 3s, gpu: 4, reset: true}
  - {at: 5s, gpu: 4, xid: 48}
  - {at: 7s, gpu: 4, reset: true}
  - {at: 9s, gpu: 4, xid: 48}
  - {at: 11s, gpu: 4, reset: true}
`,
	})
	// The scenario runs on real time; the 13s are 20 s apart, past the rule's 15 s burst.
	eventually(t, "repeat rule, node finding and escalation on every sink", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
		if err != nil {
			return false, "", err
		}
		cond, err := nodeCondition(ctx, c, node, nodecondition.Type)
		if err != nil {
			return false, "", err
		}
		g0, g4 := sums[uuids[0]], sums[uuids[4]]
		ok := g0.Health == "Degraded" && slices.Contains(g0.Reasons, health.ReasonRepeatedXID13) &&
			g4.Health == "Unhealthy" && slices.Equal(g4.Reasons, []string{health.ReasonFaultReturnsAfterRepair}) &&
			g4.History != nil && g4.History.Faults == 3 && g4.History.Resets == 3 &&
			ann[gpuhealthv1.UnhealthyIDsKey] == "4" &&
			cond.Status == corev1.ConditionTrue && strings.Contains(cond.Message, "node: "+health.ReasonXIDSpreadOverGPU)
		for _, i := range []int{1, 2, 3} {
			ok = ok && sums[uuids[i]].Health == "Healthy"
		}
		return ok, fmt.Sprintf("gpu0=%+v gpu4=%+v history=%v ids=%q condition=%s %q", g0, g4, g4.History, ann[gpuhealthv1.UnhealthyIDsKey], cond.Status, cond.Message), nil
	})
}
