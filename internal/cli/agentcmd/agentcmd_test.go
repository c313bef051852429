package agentcmd

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
)

// TestOptionsValidate: flags that cannot work are bad input (exit status 2) before anything is
// opened, and the node's name comes from $NODE_NAME when --node-name is not given.
func TestOptionsValidate(t *testing.T) {
	cases := []struct {
		name                         string
		backend, scenario, node, env string
		wantErr                      string // "" when valid
		wantNode                     string
	}{
		{name: "nvml on a named node", backend: "nvml", node: "n1", wantNode: "n1"},
		{name: "sim with its scenario", backend: "sim", scenario: "s.yaml", node: "n1", wantNode: "n1"},
		{name: "the node from NODE_NAME", backend: "nvml", env: "from-env", wantNode: "from-env"},
		{name: "--node-name wins over NODE_NAME", backend: "nvml", node: "n1", env: "from-env", wantNode: "n1"},
		{name: "no node name", backend: "nvml", wantErr: "--node-name: required (or set NODE_NAME)"},
		{name: "an unknown backend", backend: "gpu", node: "n1", wantErr: `--backend: must be nvml or sim, got "gpu"`},
		{name: "sim without a scenario", backend: "sim", node: "n1", wantErr: "--scenario: required with --backend sim"},
		{name: "a scenario with nvml", backend: "nvml", scenario: "s.yaml", node: "n1", wantErr: "--scenario: only with --backend sim"},
		{name: "the node name is checked first", backend: "gpu", wantErr: "--node-name: required"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			o := Options{BackendFlags: nodegpu.BackendFlags{Backend: tc.backend, Scenario: tc.scenario}, NodeName: tc.node}
			err := o.Validate()
			if tc.wantErr == "" {
				if err != nil || o.NodeName != tc.wantNode {
					t.Errorf("Validate() = %v with node %q; want nil with node %q", err, o.NodeName, tc.wantNode)
				}
				return
			}
			var bad cmdutil.InputError
			if !errors.As(err, &bad) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v; want bad input (exit status %d) saying %q", err, cmdutil.ExitBadInput, tc.wantErr)
			}
		})
	}
}
