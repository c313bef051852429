package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli"
)

// A scenario the simulated driver cannot serve, a malformed one, and a missing flag each exit 2
// with one line naming the problem; inject without a simulator exits 1.
func TestSimDriverBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	head := "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n\ngpus: {count: 2}\nevents:\n"
	kmsg := write("kmsg.yaml", head+`  - {at: 1s, kmsg: "NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus"}`+"\n")
	bad := write("bad.yaml", head+"  - {at: 1s, gpu: 5, xid: 79}\n")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"kmsg event", []string{"sim-driver", "serve", "--scenario", kmsg, "--driver-root", dir}, cli.ExitBadInput, "line 6: kmsg"},
		{"GPU out of range", []string{"sim-driver", "serve", "--scenario", bad, "--driver-root", dir}, cli.ExitBadInput, "line 6"},
		{"no driver root", []string{"sim-driver", "serve", "--scenario", bad}, cli.ExitBadInput, "--driver-root"},
		{"inject without simulator", []string{"sim-driver", "inject", "--driver-root", dir, "{gpu: 0, xid: 79}"}, cli.ExitFailure, "no simulator serves"},
		{"inject without event", []string{"sim-driver", "inject", "--driver-root", dir}, cli.ExitBadInput, "arg"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Execute(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want exit %d, one line with %q", code, stderr.String(), tc.code, tc.want)
			}
		})
	}
}
