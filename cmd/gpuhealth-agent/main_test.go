package main

import (
	"bytes"
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
