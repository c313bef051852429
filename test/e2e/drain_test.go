//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/test/controlplane"
)

// gpuhealthCLI runs the gpuhealth binary as an operator would and returns stdout, stderr and
// the exit code.
func gpuhealthCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), gpuhealthBinary(t), args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

type statusRow struct {
	Node    string   `json:"node"`
	Index   int      `json:"index"`
	UUID    string   `json:"uuid"`
	Model   string   `json:"model"`
	Health  string   `json:"health"`
	Reasons []string `json:"reasons"`
	Since   *string  `json:"since"`
	Drained bool     `json:"drained"`
}

// TestDrainUndrainAndStatus drains a GPU by index with the CLI, as an operator would: every
// reporter of the node's agent treats it as Unhealthy (AdminDrain), the drain survives an agent
// killed and restarted, `status` shows it, and only undrain ends it.
func TestDrainUndrainAndStatus(t *testing.T) {
	t.Parallel()
	c := controlplane.StartT(t, controlplane.Options{DisableScheduler: true, DisableControllerManager: true})
	const node = "drain-node"
	uuids := gpuNode(t, c, node, 4)
	kubeconfig := agentKubeconfig(t, c)
	checkpoint := filepath.Join(t.TempDir(), "ckpt.json")
	admin := c.AdminKubeconfig()
	first := startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: "events: []\n"})

	if _, stderr, code := gpuhealthCLI(t, "drain", node, "9", "--reason", "x", "--kubeconfig", admin); code != 2 || !strings.Contains(stderr, "no GPU") {
		t.Errorf("drain of a missing GPU: exit %d, %q; want exit 2 naming the problem", code, stderr)
	}
	if _, stderr, code := gpuhealthCLI(t, "drain", node, "2", "--kubeconfig", admin); code != 2 || !strings.Contains(stderr, "--reason") {
		t.Errorf("drain without a reason: exit %d, %q; want exit 2", code, stderr)
	}
	out, stderr, code := gpuhealthCLI(t, "drain", node, "2", "--reason", "fan noise, ticket 42", "--kubeconfig", admin)
	if code != 0 || !strings.Contains(out, uuids[2]) {
		t.Fatalf("drain: exit %d, stdout %q, stderr %q", code, out, stderr)
	}

	drained := func(what string) {
		t.Helper()
		eventually(t, what, func(ctx context.Context) (bool, string, error) {
			ann, err := nodeAnnotations(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			rs, err := rules(ctx, c, node)
			if err != nil {
				return false, "", err
			}
			r, ok := rs[devicetaint.RuleName(node, uuids[2])]
			return ann[gpuhealthv1.UnhealthyIDsKey] == "2" && ok && r.Spec.Taint.Key == "gpuhealth.dev/admin-drain",
				fmt.Sprintf("ids=%q rules=%v", ann[gpuhealthv1.UnhealthyIDsKey], ruleNames(rs)), nil
		})
	}
	drained("every sink reports the drain")

	stdout, _, code := gpuhealthCLI(t, "status", "--node", node, "-o", "json", "--kubeconfig", admin)
	if code != 0 {
		t.Fatalf("status exit %d", code)
	}
	var st struct {
		GPUs []statusRow `json:"gpus"`
	}
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status -o json: %v\n%s", err, stdout)
	}
	if len(st.GPUs) != 4 {
		t.Fatalf("status lists %d GPUs, want 4: %s", len(st.GPUs), stdout)
	}
	for _, g := range st.GPUs {
		wantDrained := g.Index == 2
		if g.Node != node || g.UUID != uuids[g.Index] || g.Drained != wantDrained ||
			(wantDrained && (g.Health != "Unhealthy" || g.Reasons[0] != "AdminDrain" || g.Since == nil)) ||
			(!wantDrained && g.Health != "Healthy") {
			t.Errorf("status row %+v", g)
		}
	}
	table, _, _ := gpuhealthCLI(t, "status", "--kubeconfig", admin)
	if !strings.Contains(table, "DRAINED") || !strings.Contains(table, "AdminDrain") {
		t.Errorf("status table:\n%s", table)
	}

	first.kill()
	startAgent(t, agentSetup{node: node, gpus: 4, kubeconfig: kubeconfig, checkpoint: checkpoint, scenario: "events: []\n"})
	drained("the drain survives an agent restart")

	if out, stderr, code := gpuhealthCLI(t, "undrain", node, uuids[2], "--kubeconfig", admin); code != 0 {
		t.Fatalf("undrain: exit %d, %q %q", code, out, stderr)
	}
	eventually(t, "undrain ends it everywhere", func(ctx context.Context) (bool, string, error) {
		ann, err := nodeAnnotations(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		rs, err := rules(ctx, c, node)
		if err != nil {
			return false, "", err
		}
		_, ids := ann[gpuhealthv1.UnhealthyIDsKey]
		_, drains := ann[gpuhealthv1.DrainsKey]
		return !ids && !drains && len(rs) == 0, fmt.Sprintf("ids=%v drains=%v rules=%v", ids, drains, ruleNames(rs)), nil
	})
}
