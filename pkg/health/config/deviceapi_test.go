package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestDeviceAPIIsOffByDefaultAndDefaulted(t *testing.T) {
	d := mustParse(t, "").AgentSection().DeviceAPI
	if d.Socket != "" || d.Group != "" || d.MaxWatchers != config.DefaultDeviceAPIMaxWatchers {
		t.Errorf("defaults %+v: want no socket (off), no group, %d watchers", d, config.DefaultDeviceAPIMaxWatchers)
	}
	d = mustParse(t, "agent:\n  deviceAPI: {socket: /var/run/gpuhealth/device-api.sock, group: \"2000\", maxWatchers: 8}\n").AgentSection().DeviceAPI
	if d.Socket != "/var/run/gpuhealth/device-api.sock" || d.Group != "2000" || d.MaxWatchers != 8 {
		t.Errorf("parsed %+v", d)
	}
	if d := mustParse(t, "agent:\n  deviceAPI: {socket: /run/d.sock, group: gpu-readers}\n").AgentSection().DeviceAPI; d.Group != "gpu-readers" {
		t.Errorf("a group name: parsed %+v", d)
	}
}

func TestDeviceAPIValidation(t *testing.T) {
	for _, tc := range []struct {
		name, body, path, detail string
	}{
		{"a relative socket", "agent: {deviceAPI: {socket: device-api.sock}}\n", "agent.deviceAPI.socket", "must be an absolute path"},
		{"a directory", "agent: {deviceAPI: {socket: /var/run/gpuhealth/}}\n", "agent.deviceAPI.socket", "clean path"},
		{"an unclean path", "agent: {deviceAPI: {socket: /var/run/../run/d.sock}}\n", "agent.deviceAPI.socket", "clean path"},
		{"a path too long for a socket", "agent: {deviceAPI: {socket: /" + strings.Repeat("d", 120) + "}}\n", "agent.deviceAPI.socket", "at most 107"},
		{"a group that is no name", "agent: {deviceAPI: {socket: /run/d.sock, group: \"gpu readers\"}}\n", "agent.deviceAPI.group", "group name or a numeric GID"},
		{"a negative GID", "agent: {deviceAPI: {socket: /run/d.sock, group: \"-1\"}}\n", "agent.deviceAPI.group", "group name or a numeric GID"},
		{"chown's no-change GID", "agent: {deviceAPI: {socket: /run/d.sock, group: \"4294967295\"}}\n", "agent.deviceAPI.group", "no change"},
		{"a group without a socket", "agent: {deviceAPI: {group: \"2000\"}}\n", "agent.deviceAPI.group", "socket is empty"},
		{"negative watchers", "agent: {deviceAPI: {socket: /run/d.sock, maxWatchers: -1}}\n", "agent.deviceAPI.maxWatchers", "between 1 and 4096"},
		{"too many watchers", "agent: {deviceAPI: {socket: /run/d.sock, maxWatchers: 5000}}\n", "agent.deviceAPI.maxWatchers", "between 1 and 4096"},
		{"an unknown field", "agent: {deviceAPI: {path: /run/d.sock}}\n", "", `"path"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			if err == nil {
				t.Fatalf("accepted %q", tc.body)
			}
			if !saysAt(err, tc.path, tc.detail) {
				t.Errorf("error %v, want %s: ...%s...", err, tc.path, tc.detail)
			}
		})
	}
}

// saysAt reports whether err says detail at the field path; an empty path takes the whole
// error (a decoding error has no field path).
func saysAt(err error, path, detail string) bool {
	var fes config.FieldErrors
	if path == "" || !errors.As(err, &fes) {
		return path == "" && strings.Contains(err.Error(), detail)
	}
	for _, fe := range fes {
		if fe.Path == path && strings.Contains(fe.Detail, detail) {
			return true
		}
	}
	return false
}
