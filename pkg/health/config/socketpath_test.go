package config_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// The socket paths of agent.deviceAPI and agent.nvsentinel are checked alike; each says where
// its socket is when given a relative path. The details are matched whole: users read them.
func TestSocketPathDetails(t *testing.T) {
	long := "/" + strings.Repeat("d", 120)
	for _, tc := range []struct {
		name, body, path, detail string
	}{
		{"device API: relative", "agent: {deviceAPI: {socket: device-api.sock}}\n", "agent.deviceAPI.socket",
			`must be an absolute path, e.g. /var/run/gpuhealth/device-api.sock, got "device-api.sock"`},
		{"device API: a directory", "agent: {deviceAPI: {socket: /var/run/gpuhealth/}}\n", "agent.deviceAPI.socket",
			`must be the socket file's clean path, e.g. /var/run/gpuhealth/device-api.sock, got "/var/run/gpuhealth/"`},
		{"device API: too long", "agent: {deviceAPI: {socket: " + long + "}}\n", "agent.deviceAPI.socket",
			"is 121 bytes long; a Unix socket's path may have at most 107"},
		{"nvsentinel: relative", "agent: {nvsentinel: {socket: nvsentinel.sock}}\n", "agent.nvsentinel.socket",
			`must be an absolute path (NVSentinel's platform-connector listens on /var/run/nvsentinel/nvsentinel.sock on the host), got "nvsentinel.sock"`},
		{"nvsentinel: unclean", "agent: {nvsentinel: {socket: /var/run/../run/nv.sock}}\n", "agent.nvsentinel.socket",
			`must be the socket file's clean path, e.g. /var/run/nvsentinel/nvsentinel.sock, got "/var/run/../run/nv.sock"`},
		{"nvsentinel: too long", "agent: {nvsentinel: {socket: " + long + "}}\n", "agent.nvsentinel.socket",
			"is 121 bytes long; a Unix socket's path may have at most 107"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			if got, want := detailsByPath(err)[tc.path], tc.detail+"; "; got != want {
				t.Errorf("%s: got %q, want %q (error %v)", tc.path, got, want, err)
			}
		})
	}
}
