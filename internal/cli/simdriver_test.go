package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
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
	afterReset := write("after-reset.yaml", head+"  - {afterReset: 1s, gpu: 1, latent: {xid: 48}}\n")
	diagWord := write("diag-word.yaml", head+"  - {at: 1s, gpu: 1, diag: flaky}\n")
	tests := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"kmsg event", []string{"sim-driver", "serve", "--scenario", kmsg, "--driver-root", dir}, cli.ExitBadInput, "line 6: kmsg"},
		{"GPU out of range", []string{"sim-driver", "serve", "--scenario", bad, "--driver-root", dir}, cli.ExitBadInput, "line 6"},
		{"no driver root", []string{"sim-driver", "serve", "--scenario", bad}, cli.ExitBadInput, "--driver-root"},
		{"latent after a reset", []string{"sim-driver", "serve", "--scenario", afterReset, "--driver-root", dir}, cli.ExitBadInput, "(line 6): afterReset: latent is a state a reset does not change"},
		{"unknown diag word", []string{"sim-driver", "serve", "--scenario", diagWord, "--driver-root", dir}, cli.ExitBadInput, "diag: must be one of pass, fail, config, skip, hang, unreachable, busy"},
		{"unknown DCGM version", []string{"sim-driver", "serve", "--scenario", kmsg, "--driver-root", dir, "--dcgm-version", "5.0.0"}, cli.ExitBadInput, "--dcgm-version"},
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

// childArgsEnv makes TestSimDriverDCGMIChild run the gpuhealth command line it holds (a JSON
// list) and exit with its status, as cmd/gpuhealth does: dcgmi's statuses end the process.
const childArgsEnv = "GPUHEALTH_CLI_TEST_ARGS"

func TestSimDriverDCGMIChild(t *testing.T) {
	raw := os.Getenv(childArgsEnv)
	if raw == "" {
		t.Skip("the child of TestSimDriverDCGMI")
	}
	var args []string
	if err := json.Unmarshal([]byte(raw), &args); err != nil {
		t.Fatal(err)
	}
	os.Exit(cli.Execute(context.Background(), args, os.Stdout, os.Stderr))
}

// `gpuhealth sim-driver dcgmi` exits with DCGM's status, which only a process shows: 235 when
// no simulator serves the driver root, 254 for a command line dcgmi refuses.
func TestSimDriverDCGMI(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"no simulator", []string{"--driver-root", dir, "diag", "-r", "2", "-i", "gpu:2", "-j", "--host", "10.1.2.3:5555"}, 235,
			"Error: unable to establish a connection to the specified host: 10.1.2.3:5555\nError: Unable to connect to host engine. Host engine connection invalid/disconnected.\n", ""},
		{"no driver root", []string{"diag", "-r", "2", "-i", "gpu:2"}, 254, "", "Error: --driver-root is required."},
		{"an option dcgmi does not know", []string{"--driver-root", dir, "diag", "-r", "2", "-i", "gpu:2", "--frobnicate"}, 254, "",
			"Error: Couldn't find match for argument for arg --frobnicate.\nAn error occurred trying to parse the command line.\n"},
		{"3.x's -i", []string{"--driver-root", dir, "--dcgm-version", "3.3.9", "diag", "-r", "2", "-i", "gpu:2"}, 254, "", "Invalid gpu list 'gpu:2'"},
		{"help", []string{"--help"}, 0, "dcgmi diag -r 1|2|3|4 -i gpu:ID|ID", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args, _ := json.Marshal(append([]string{"sim-driver", "dcgmi"}, tc.args...))
			cmd := exec.Command(os.Args[0], "-test.run=^TestSimDriverDCGMIChild$")
			cmd.Env = append(os.Environ(), childArgsEnv+"="+string(args))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d\nstdout %q\nstderr %q\nwant exit %d, stdout with %q, stderr with %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
	log, err := os.ReadFile(filepath.Join(dir, "dcgmi-calls.log"))
	if err != nil || strings.Count(string(log), "\n") != 3 || !strings.Contains(string(log), " dcgmi diag -r 2 -i gpu:2 -j --host 10.1.2.3:5555\n") {
		t.Errorf("the calls log: %v\n%s", err, log)
	}
}
