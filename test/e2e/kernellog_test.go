//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// TestAgentKernelLogLinesReachTheNode runs a real agent whose scenario logs kernel-log lines
// (simulated GPU i sits at PCI 0000:(10+i):00.0): the driver's XID 79 and RmInitAdapter lines
// make GPUs 2 and 5 Unhealthy on every sink, the same XID written by a process (facility user)
// changes nothing, and the metrics say the node's own kernel log is not read under the simulator.
func TestAgentKernelLogLinesReachTheNode(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "agent-kmsg"
	uuids := gpuNode(t, c, node, 8)
	a := startAgent(t, agentSetup{
		node: node, gpus: 8, kubeconfig: agentKubeconfig(t, c), checkpoint: filepath.Join(t.TempDir(), "ckpt.json"),
		scenario: `events:
  - {at: 1s, kmsg: "NVRM: Xid (PCI:0000:12:00): 79, pid=1234, name=python, GPU has fallen off the bus."}
  - {at: 1s, kmsg: "NVRM: GPU 0000:15:00.0: RmInitAdapter failed! (0x24:0x72:1568)"}
  - {at: 1s, kmsg: "11,7,1000000,-;NVRM: Xid (PCI:0000:14:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU"}
`,
	})

	eventually(t, "the kernel-log faults on the annotation and the DeviceTaintRules", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		_, r2 := rs[devicetaint.RuleName(node, uuids[2])]
		_, r5 := rs[devicetaint.RuleName(node, uuids[5])]
		_, r4 := rs[devicetaint.RuleName(node, uuids[4])]
		return ann[gpuhealthv1.UnhealthyIDsKey] == "2,5" && r2 && r5 && !r4 && len(rs) == 2,
			fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), nil
	})

	resp, err := http.Get(a.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`gpuhealth_source_up{node=%q,source="kmsg"} 0`, node)
	if !strings.Contains(string(body), want) {
		t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "gpuhealth_source_up"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
