package config_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestKernelLogSection(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		enabled  bool
		path     string
		relay    string
		wantErrs []string
	}{
		{name: "absent: on, /dev/kmsg", enabled: true, path: "/dev/kmsg"},
		{name: "off", body: "kernelLog: {enabled: false}\n", enabled: false, path: "/dev/kmsg"},
		{name: "another path", body: "kernelLog:\n  path: /host/dev/kmsg\n", enabled: true, path: "/host/dev/kmsg"},
		{name: "relative path", body: "kernelLog:\n  path: dev/kmsg\n", wantErrs: []string{"kernelLog.path", "absolute"}},
		{name: "from a relay: no path", body: "kernelLog:\n  relaySocket: /run/gpuhealth-kmsg/relay.sock\n", enabled: true, relay: "/run/gpuhealth-kmsg/relay.sock"},
		{name: "a path and a relay", body: "kernelLog:\n  path: /dev/kmsg\n  relaySocket: /run/r.sock\n", wantErrs: []string{"kernelLog.relaySocket", "not both"}},
		{name: "relative relay socket", body: "kernelLog:\n  relaySocket: r.sock\n", wantErrs: []string{"kernelLog.relaySocket", "absolute"}},
		{name: "relay socket too long for sun_path", body: "kernelLog:\n  relaySocket: /" + strings.Repeat("d", 107) + "\n", wantErrs: []string{"kernelLog.relaySocket", "at most 107 bytes, got 108"}},
		{name: "unknown field names its line", body: "kernelLog:\n  enable: true\n", wantErrs: []string{`"enable"`, "line 4"}},
		{name: "enabled is a boolean", body: "kernelLog: {enabled: sometimes}\n", wantErrs: []string{"line 3", `"sometimes"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(header + tc.body))
			if len(tc.wantErrs) > 0 {
				if err == nil {
					t.Fatalf("Parse succeeded, want an error mentioning %q", tc.wantErrs)
				}
				for _, w := range tc.wantErrs {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not mention %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k := c.KernelLogSection()
			if *k.Enabled != tc.enabled || k.Path != tc.path || k.RelaySocket != tc.relay {
				t.Errorf("KernelLogSection = {%v %q %q}, want {%v %q %q}", *k.Enabled, k.Path, k.RelaySocket, tc.enabled, tc.path, tc.relay)
			}
		})
	}
}
