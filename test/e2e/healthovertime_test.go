//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
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

// TestAgentReportsAMissingGPU gives the agent a node whose PCI bus (a sysfs tree the test
// writes) holds four NVIDIA GPUs while its backend opens three: the fourth is reported Unhealthy
// (GPUMissing) on the gpu-health annotation and the node condition says the node runs below its
// capacity, while Volcano's index list, which only holds GPUs the device plugin offers, stays
// empty.
func TestAgentReportsAMissingGPU(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-missing-gpu"
	gpuNode(t, c, node, 3)
	sysfs := t.TempDir()
	for i := range 4 { // the simulator's GPU i sits at 0000:1i:00.0
		dir := filepath.Join(sysfs, "bus", "pci", "devices", fmt.Sprintf("0000:1%d:00.0", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, v := range map[string]string{"vendor": "0x10de", "device": "0x2330", "class": "0x030200"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	startAgent(t, agentSetup{
		node: node, gpus: 3, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		topConfig: "inventory: {sysfsRoot: " + sysfs + "}\n",
	})
	const placeholder = "MISSING-0000:13:00.0"
	eventually(t, "the missing GPU on the annotation and the node condition", func(ctx context.Context) (bool, string, error) {
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
		m := sums[placeholder]
		ok := len(sums) == 4 && m.Missing && m.Index == -1 && m.Health == "Unhealthy" && slices.Equal(m.Reasons, []string{health.ReasonGPUMissing}) &&
			ann[gpuhealthv1.UnhealthyIDsKey] == "" && cond.Status == corev1.ConditionTrue &&
			strings.Contains(cond.Message, "the node runs 3 of its 4 GPUs")
		return ok, fmt.Sprintf("missing=%+v (of %d) ids=%q condition=%s %q", m, len(sums), ann[gpuhealthv1.UnhealthyIDsKey], cond.Status, cond.Message), nil
	})
}

// TestAgentReportsEarlyWarnings runs the fabric and early-warning checks through a real agent to
// the real API server: a failed fabric registration keeps new work off its GPU (Volcano's list),
// and the warnings that only ask for a replacement soon (spare rows running out, SRAM past its
// threshold, a PCIe link trained narrow) make their GPUs Degraded, not Unhealthy.
func TestAgentReportsEarlyWarnings(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-early-warnings"
	uuids := gpuNode(t, c, node, 5)
	startAgent(t, agentSetup{
		node: node, gpus: 5, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: `events:
  - {at: 1s, gpu: 0, fabric: {state: completed, status: 999}}
  - {at: 1s, gpu: 1, rowRemapHistogram: {low: 2, none: 1}}
  - {at: 1s, gpu: 2, sramThresholdExceeded: true}
  - {at: 1s, gpu: 3, pcieLink: {width: 8}}
`,
	})
	want := map[int][2]string{
		0: {"Unhealthy", "FabricRegistrationFailed"},
		1: {"Degraded", "RowRemapAvailabilityNone"},
		2: {"Degraded", "SRAMECCThresholdExceeded"},
		3: {"Degraded", "PCIeLinkDegraded"},
		4: {"Healthy", ""},
	}
	eventually(t, "every early warning on the gpu-health annotation", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
		if err != nil {
			return false, "", err
		}
		ok := ann[gpuhealthv1.UnhealthyIDsKey] == "0"
		var got []string
		for i, w := range want {
			s := sums[uuids[i]]
			got = append(got, fmt.Sprintf("%d:%s%v", i, s.Health, s.Reasons))
			ok = ok && s.Health == w[0] && (w[1] == "" || slices.Contains(s.Reasons, w[1]))
		}
		slices.Sort(got)
		return ok, fmt.Sprintf("ids=%q %v", ann[gpuhealthv1.UnhealthyIDsKey], got), nil
	})
}

// TestAgentsAttributeAnXIDToAPeerNodesGPU runs the NVL72 pattern across nodes through real
// agents and the real API server: on two nodes of one NVLink domain (GPU feature discovery's
// nvidia.com/gpu.clique label), one GPU logs XID 149 and a GPU of the other node an XID 145 its
// driver says an earlier XID caused. The second node's agent reads the first's report and makes
// its GPU Degraded, attributed to the peer's (XID145CausedByPeerGPU, off Volcano's list), while
// its own XID 145 of no cause stays Unhealthy; a node of another domain blames nobody.
func TestAgentsAttributeAnXIDToAPeerNodesGPU(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const clique = "nvidia.com/gpu.clique"
	rack := map[string]string{clique: "9277d399-0674-44a9-b64e-d85bb19ce2b0.32766"}
	other := map[string]string{clique: "0d5e1f7c-4a4b-4c1e-9a55-7ad3f2b7c001.1"}
	const root, peer, elsewhere = "nvl72-a-0", "nvl72-a-1", "nvl72-b-0"
	rootUUIDs := labelledGPUNode(t, c, root, 4, rack)
	peerUUIDs := labelledGPUNode(t, c, peer, 4, rack)
	elseUUIDs := labelledGPUNode(t, c, elsewhere, 4, other)
	kubeconfig := agentKubeconfig(t, c)
	// The driver's own line, which names the XID that caused it: only a peer fault of that XID
	// explains it (a scenario's causedByPrevious names none).
	caused := "  - {at: 1s, kmsg: \"NVRM: Xid (PCI:0000:10:00): 145,  caused by previous Xid 149\"}\n"
	startAgent(t, agentSetup{node: root, gpus: 4, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n  - {at: 1s, gpu: 2, xid: 149}\n"})
	startAgent(t, agentSetup{node: peer, gpus: 4, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n" + caused + "  - {at: 1s, gpu: 1, xid: 145}\n"})
	startAgent(t, agentSetup{node: elsewhere, gpus: 4, kubeconfig: kubeconfig, checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: "events:\n" + caused})
	summaries := func(ctx context.Context, node string) (map[string]gpuhealthv1.GPUSummary, map[string]string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return nil, nil, err
		}
		sums, err := gpuhealthv1.ParseHealth(ann[gpuhealthv1.HealthKey])
		return sums, ann, err
	}
	eventually(t, "the peer's caused-by XID attributed to the root node's GPU, and no one else's", func(ctx context.Context) (bool, string, error) {
		rootSums, _, err := summaries(ctx, root)
		if err != nil {
			return false, "", err
		}
		peerSums, peerAnn, err := summaries(ctx, peer)
		if err != nil {
			return false, "", err
		}
		elseSums, _, err := summaries(ctx, elsewhere)
		if err != nil {
			return false, "", err
		}
		r2, p0, p1, e0 := rootSums[rootUUIDs[2]], peerSums[peerUUIDs[0]], peerSums[peerUUIDs[1]], elseSums[elseUUIDs[0]]
		ok := r2.Health == "Unhealthy" && len(r2.XIDFaults) == 1 && r2.XIDFaults[0].XID == 149 &&
			p0.Health == "Degraded" && slices.Equal(p0.Reasons, []string{"XID145CausedByPeerGPU"}) && len(p0.XIDFaults) == 0 &&
			p1.Health == "Unhealthy" && slices.Equal(p1.Reasons, []string{"XID145"}) &&
			peerAnn[gpuhealthv1.UnhealthyIDsKey] == "1" &&
			e0.Health == "Unhealthy" && slices.Equal(e0.Reasons, []string{"XID145"})
		return ok, fmt.Sprintf("root gpu2=%+v peer gpu0=%+v gpu1=%+v ids=%q elsewhere gpu0=%+v", r2, p0, p1, peerAnn[gpuhealthv1.UnhealthyIDsKey], e0), nil
	})
	// The attribution's Event on the peer's Node names the root's node and GPU.
	want := "caused by XID 149 on GPU 2 (" + rootUUIDs[2] + ") of node " + root
	eventually(t, "the peer's Event naming the root", func(ctx context.Context) (bool, string, error) {
		events, err := nodeEvents(ctx, c, peer, nodecondition.EventGPUDegraded)
		if err != nil {
			return false, "", err
		}
		var msgs []string
		for _, e := range events {
			if strings.Contains(e.Message, want) {
				return true, "", nil
			}
			msgs = append(msgs, e.Message)
		}
		return false, fmt.Sprintf("GPUDegraded Events %q, want one saying %q", msgs, want), nil
	})
}
