package main

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		code       int
		wantOutput string // in stdout or stderr
	}{
		{"version", []string{"--version"}, cmdutil.ExitOK, "gpuhealth-agent version devel"},
		{"help, as `gpuhealth agent --help`", []string{"agent", "--help"}, cmdutil.ExitOK, "--backend"},
		{"an unknown flag is bad input", []string{"agent", "--bogus"}, cmdutil.ExitBadInput, "unknown flag: --bogus"},
		{"an argument is bad input", []string{"agent", "extra"}, cmdutil.ExitBadInput, `unknown command "extra"`},
		{"no node name", []string{"--backend", "sim"}, cmdutil.ExitBadInput, "--node-name: required"},
		{"an unknown backend", []string{"agent", "--node-name", "n", "--backend", "gpu"}, cmdutil.ExitBadInput, "--backend: must be nvml or sim"},
		{"a bad log format", []string{"--log-format", "xml"}, cmdutil.ExitBadInput, "--log-format: must be text or json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NODE_NAME", "")
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tc.args, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.wantOutput) {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit %d mentioning %q", code, stdout.String(), stderr.String(), tc.code, tc.wantOutput)
			}
		})
	}
}

// TestAgentLinksNoFullClientset keeps the agent lean: client-go's clientset, its scheme of every
// API group, its informer factory and apply configurations (which import discovery, and through
// it the scheme) made up about a third of the agent's resident memory. The agent's code takes
// internal/kube's narrow client instead; a new import of any of these fails here, not in a
// benchmark run weeks later.
func TestAgentLinksNoFullClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	banned := []string{
		"k8s.io/client-go/kubernetes",
		"k8s.io/client-go/kubernetes/scheme",
		"k8s.io/client-go/informers",
		"k8s.io/client-go/discovery",
		"k8s.io/client-go/applyconfigurations/meta/v1",
		"html/template", // through gRPC's x/net/trace without the grpcnotrace tag
	}
	deps := strings.Fields(string(out))
	for _, b := range banned {
		if slices.Contains(deps, b) {
			t.Errorf("gpuhealth-agent links %s (find the importer with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./cmd/gpuhealth-agent | grep %s)", b, b)
		}
	}
	apiGroups := 0
	for _, d := range deps {
		if strings.HasPrefix(d, "k8s.io/api/") {
			apiGroups++
		}
	}
	// core, resource, coordination (the client's), rbac and flowcontrol (types the agent's
	// objects name); the full scheme is 56.
	if apiGroups > 8 {
		t.Errorf("gpuhealth-agent links %d k8s.io/api packages, want at most 8", apiGroups)
	}
}
