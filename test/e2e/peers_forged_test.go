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

	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAForgedPeerFaultHidesNoFatalXID runs a real agent on the real API server next to a node of
// its NVLink domain (same nvidia.com/gpu.clique) that runs no agent: its gpu-health annotation is
// whatever the test writes there, as a compromised node's kubelet credentials could. The agent's
// GPU 0 logs an XID 145 its driver says XID 149 caused, under a rule that evicts. A fault of XID
// 149 on an Unhealthy GPU of the peer's report explains it (Degraded, no eviction); a forged fault
// of another XID, one on a GPU the report calls Degraded, or one on a 100 kB UUID does not, and
// the attribution made before is withdrawn each time: Unhealthy, evicting, on Volcano's list, with
// a condition message no peer text makes long.
func TestAForgedPeerFaultHidesNoFatalXID(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	rack := map[string]string{"nvidia.com/gpu.clique": "9277d399-0674-44a9-b64e-d85bb19ce2b0.32766"}
	const victim, forger = "nvl72-a-1", "nvl72-a-0"
	uuids := labelledGPUNode(t, c, victim, 2, rack)
	forgerUUIDs := labelledGPUNode(t, c, forger, 4, rack)
	startAgent(t, agentSetup{node: victim, gpus: 2, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario:  "events:\n  - {at: 1s, kmsg: \"NVRM: Xid (PCI:0000:10:00): 145,  caused by previous Xid 149\"}\n",
		topConfig: "xids:\n  overrides:\n    - {xids: [145], evict: true}\n"})

	since := time.Now().UTC().Format(time.RFC3339)
	report := func(uuid, health string, xid int) string {
		return fmt.Sprintf(`{%q:{"index":2,"health":%q,"xidFaults":[{"xid":%d,"since":%q}]}}`, uuid, health, xid, since)
	}
	// judged waits for GPU 0 to be judged so on the gpu-health annotation and Volcano's list, with
	// the GPUUnhealthy condition True while it is Unhealthy and its message short whatever the
	// peer wrote.
	judged := func(what, health string, evict bool, reason, ids string) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, string, error) {
			ann, err := nodeAnnotations(ctx, c, victim)
			if err != nil {
				return false, "", err
			}
			sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
			if err != nil {
				return false, "", err
			}
			cond, err := nodeCondition(ctx, c, victim, nodecondition.Type)
			if err != nil {
				return false, "", err
			}
			g0 := sums[uuids[0]]
			ok := g0.Health == health && g0.Evict == evict && slices.Equal(g0.Reasons, []string{reason}) && ann[gpuhealthv1.UnhealthyIDsKey] == ids &&
				(health != "Unhealthy" || cond.Status == corev1.ConditionTrue) && len(cond.Message) < 1024
			return ok, fmt.Sprintf("gpu0=%+v ids=%q condition %s (%d bytes): %.300s", g0, ann[gpuhealthv1.UnhealthyIDsKey], cond.Status, len(cond.Message), cond.Message), nil
		})
	}
	fatal := func(what string) {
		t.Helper()
		judged(what, "Unhealthy", true, "XID145", "0")
	}
	attributed := func(what string) {
		t.Helper()
		judged(what, "Degraded", false, "XID145CausedByPeerGPU", "")
	}
	forge := func(value string) {
		t.Helper()
		mergePatchNode(t, c.Admin(), forger, map[string]any{gpuhealthv1.HealthKey: value})
	}

	fatal("the XID 145 before any peer report: its rule, Unhealthy and evicting")
	forge(report(forgerUUIDs[2], "Unhealthy", 149))
	attributed("the XID 145 attributed to the peer's XID 149")

	forge(report(forgerUUIDs[2], "Unhealthy", 1))
	fatal("a forged fault of XID 1 in place of the 149: the attribution withdrawn, none made")

	forge(report(forgerUUIDs[2], "Unhealthy", 149))
	attributed("the XID 149 reported again")
	// Each explains nothing on its own (the unit tests hold each apart): together, in one report.
	degraded, huge := report(forgerUUIDs[2], "Degraded", 149), report("GPU-"+strings.Repeat("a", 100_000), "Unhealthy", 149)
	forge(degraded[:len(degraded)-1] + "," + huge[1:])
	fatal("the XID 149 on a GPU the peer's own report calls Degraded, and on a 100 kB UUID")

	forge(report(forgerUUIDs[2], "Unhealthy", 149))
	attributed("the XID 149 reported again")
	forge("{}")
	fatal("the peer's report without the fault")
}
