package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestNVSentinelIsOptInAndDefaulted(t *testing.T) {
	c, err := config.Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	a := c.AgentSection()
	if slices.Contains(a.Reporters, config.ReporterNVSentinel) || !slices.Contains(config.KnownReporters(), config.ReporterNVSentinel) {
		t.Errorf("reporters %v, known %v: nvsentinel must be known and off by default", a.Reporters, config.KnownReporters())
	}
	if n := a.NVSentinel; n.Socket != "/var/run/nvsentinel/nvsentinel.sock" || n.Remediation != "gpuhealth" || n.RebootAction != "" {
		t.Errorf("defaults %+v", n)
	}
	c, err = config.Parse([]byte(header + "agent:\n  reporters: [annotation, nvsentinel]\n  nvsentinel: {socket: /run/nv/pc.sock, remediation: nvsentinel, rebootAction: RESTART_VM}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.AgentSection().NVSentinel; n.Socket != "/run/nv/pc.sock" || n.Remediation != "nvsentinel" || n.RebootAction != "RESTART_VM" {
		t.Errorf("parsed %+v", n)
	}
}

func TestNVSentinelValidation(t *testing.T) {
	for _, tc := range []struct {
		name, body, path, detail string
	}{
		{"a relative socket", "agent: {nvsentinel: {socket: nvsentinel.sock}}\n", "agent.nvsentinel.socket", "must be an absolute path"},
		{"a directory", "agent: {nvsentinel: {socket: /var/run/nvsentinel/}}\n", "agent.nvsentinel.socket", "clean path"},
		{"a path too long for a socket", "agent: {nvsentinel: {socket: /" + strings.Repeat("d", 120) + "}}\n", "agent.nvsentinel.socket", "at most 107"},
		{"an unknown repairer", "agent: {nvsentinel: {remediation: both}}\n", "agent.nvsentinel.remediation", "gpuhealth or nvsentinel"},
		{"an unknown reboot action", "agent: {nvsentinel: {rebootAction: REBOOT}}\n", "agent.nvsentinel.rebootAction", "RESTART_BM, RESTART_VM"},
		{"two repairers", "agent: {nvsentinel: {remediation: nvsentinel}}\nremediation: {enabled: true}\n", "agent.nvsentinel.remediation", "set remediation.enabled: false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			if got := detailsByPath(err)[tc.path]; !strings.Contains(got, tc.detail) {
				t.Errorf("error %v, want %s: ...%s...", err, tc.path, tc.detail)
			}
		})
	}
	// gpuhealth repairing beside NVSentinel is the default, and fine.
	if _, err := config.Parse([]byte(header + "agent: {reporters: [nvsentinel], nvsentinel: {remediation: gpuhealth}}\nremediation: {enabled: true}\n")); err != nil {
		t.Errorf("gpuhealth's remediation with remediation: gpuhealth: %v", err)
	}
}

// detailsByPath returns what err says at each field path, the details of one path joined.
func detailsByPath(err error) map[string]string {
	out := map[string]string{}
	var fes config.FieldErrors
	if errors.As(err, &fes) {
		for _, fe := range fes {
			out[fe.Path] += fe.Detail + "; "
		}
	}
	return out
}
