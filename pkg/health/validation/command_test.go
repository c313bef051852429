package validation

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

var gpu2 = health.Device{UUID: "GPU-2a3b", Index: 2, PCIBusID: "00000000:41:00.0", Model: "NVIDIA H100 80GB HBM3"}

// script is a Command running a shell script with args after it ($1...).
func script(format Format, body string, args ...string) Command {
	return Command{Argv: append([]string{"sh", "-c", body, "sh"}, args...), Format: format, Timeout: time.Minute}
}

func TestNamesGPU(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want bool
	}{
		{name: "default dcgmi command", argv: []string{"dcgmi", "diag", "-r", "2", "-i", "gpu:{index}", "-j"}, want: true},
		{name: "uuid", argv: []string{"my-test", "--gpu={uuid}"}, want: true},
		{name: "pci bus id", argv: []string{"my-test", "{pciBusID}"}, want: true},
		{name: "node alone names no GPU", argv: []string{"dcgmi", "diag", "--host", "{node}:5555"}},
		{name: "no placeholder", argv: []string{"dcgmi", "diag", "-r", "2", "-j"}},
		{name: "empty", argv: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NamesGPU(tc.argv); got != tc.want {
				t.Fatalf("NamesGPU(%q) = %v, want %v", tc.argv, got, tc.want)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		want []string
	}{
		{
			name: "default dcgmi command",
			argv: []string{"dcgmi", "diag", "-r", "2", "-i", "gpu:{index}", "-j", "--host", "{node}:5555"},
			want: []string{"dcgmi", "diag", "-r", "2", "-i", "gpu:2", "-j", "--host", "node-a:5555"},
		},
		{
			name: "every placeholder, several in one argument",
			argv: []string{"t", "{uuid}/{index}/{pciBusID}/{node}", "{uuid}{uuid}"},
			want: []string{"t", "GPU-2a3b/2/00000000:41:00.0/node-a", "GPU-2a3bGPU-2a3b"},
		},
		{name: "unknown placeholders stay", argv: []string{"t", "{serial}"}, want: []string{"t", "{serial}"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			orig := slices.Clone(tc.argv)
			c := Command{Argv: tc.argv}
			if got := c.Expand(gpu2, "node-a"); !slices.Equal(got, tc.want) {
				t.Fatalf("Expand = %q, want %q", got, tc.want)
			}
			if !slices.Equal(c.Argv, orig) {
				t.Fatalf("Expand changed Argv to %q", c.Argv)
			}
		})
	}
}

func TestCommandRun(t *testing.T) {
	td, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tests := []struct {
		name string
		cmd  Command
		dev  health.Device
		want Result
		msg  []string
		warn int
	}{
		{
			name: "dcgm pass", dev: gpu2, want: Passed,
			cmd: script(FormatDCGM, `cat "$1"; exit "$2"`, td+"/dcgm4-pass.json", "0"),
			msg: []string{"3 tests passed"},
		},
		{
			name: "dcgm ISOLATE failure", dev: gpu2, want: Failed,
			cmd: script(FormatDCGM, `cat "$1"; exit "$2"`, td+"/dcgm4-fail-isolate.json", "205"),
			msg: []string{"memory: Fail", "severity ISOLATE"},
		},
		{
			name: "dcgm CONFIG warning with exit 226", dev: gpu2, want: Passed, warn: 1,
			cmd: script(FormatDCGM, `cat "$1"; exit "$2"`, td+"/dcgm4-config-warning.json", "226"),
		},
		{
			name: "dcgm target is the device's index", dev: health.Device{UUID: "GPU-1", Index: 1}, want: Error,
			cmd: script(FormatDCGM, `cat "$1"`, td+"/dcgm4-pass.json"),
			msg: []string{"no result for GPU 1"},
		},
		{
			name: "index placeholder reaches the command", dev: gpu2, want: Passed,
			cmd: script(FormatDCGM, `[ "$2" = "gpu:2" ] || exit 99; cat "$1"`, td+"/dcgm4-pass.json", "gpu:{index}"),
		},
		{
			name: "stderr banner beside the document", dev: gpu2, want: Passed,
			cmd: script(FormatDCGM, `echo "WARNING: CUDA_VISIBLE_DEVICES is set {x}" >&2; cat "$1"`, td+"/dcgm4-pass.json"),
		},
		{
			name: "dcgm host engine unreachable, message from stderr", dev: gpu2, want: Error,
			cmd: script(FormatDCGM, `echo "Error: unable to establish a connection to the specified host: localhost" >&2; exit 235`),
			msg: []string{"dcgmi exited 235: the connection to the host engine is not valid"},
		},
		{
			name: "dcgm unexplained exit quotes stderr", dev: gpu2, want: Error,
			cmd: script(FormatDCGM, `echo "Error: unknown flag --bogus" >&2; exit 1`),
			msg: []string{"dcgmi exited 1", "unknown flag --bogus"},
		},
		{
			name: "exitCode format: placeholders expanded, output is the message", dev: gpu2, want: Failed,
			cmd: script(FormatExitCode, `echo "$1 $2 $3 $4 failed"; exit 3`, "{uuid}", "{index}", "{pciBusID}", "{node}"),
			msg: []string{"exited 3: GPU-2a3b 2 00000000:41:00.0 node-a failed"},
		},
		{
			name: "exitCode format pass", dev: gpu2, want: Passed,
			cmd: script(FormatExitCode, `exit 0`),
		},
		{
			name: "Env and Dir reach the command", dev: gpu2, want: Failed,
			cmd: Command{Argv: []string{"/bin/sh", "-c", `echo "$GPU_TEST in $(pwd)"; exit 1`}, Format: FormatExitCode,
				Env: []string{"GPU_TEST=env-ok"}, Dir: dir},
			msg: []string{"env-ok in " + dir},
		},
		{
			name: "missing program", dev: gpu2, want: Error,
			cmd: Command{Argv: []string{"gpuhealth-no-such-validator-7f3a", "-i", "{index}"}},
			msg: []string{`exec: "gpuhealth-no-such-validator-7f3a": executable file not found in $PATH`},
		},
		{
			name: "killed by a signal", dev: gpu2, want: Error,
			cmd: script(FormatExitCode, `echo started; kill -9 $$`),
			msg: []string{"signal: killed"},
		},
		{
			name: "output too large", dev: gpu2, want: Error,
			cmd: script(FormatDCGM, `yes '{"DCGM Diagnostic": {}}'`),
			msg: []string{"output too large"},
		},
		{
			name: "no command", dev: gpu2, want: Error,
			cmd: Command{}, msg: []string{"no validation command"},
		},
		{
			name: "missing GPU has no index", dev: health.Device{UUID: "GPU-gone", Index: -1, Missing: true}, want: Error,
			cmd: script(FormatExitCode, `exit 0`), msg: []string{"GPU-gone has no index"},
		},
		{
			name: "unknown format", dev: gpu2, want: Error,
			cmd: Command{Argv: []string{"true"}, Format: "junit"}, msg: []string{`unknown validation format "junit"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.cmd.Run(t.Context(), tc.dev, "node-a")
			t.Logf("%s: %s", v.Result, v.Message)
			if v.Result != tc.want {
				t.Fatalf("Result = %q, want %q; message: %s", v.Result, tc.want, v.Message)
			}
			for _, s := range tc.msg {
				if !strings.Contains(v.Message, s) {
					t.Errorf("Message %q does not contain %q", v.Message, s)
				}
			}
			if len(v.Warnings) != tc.warn {
				t.Errorf("Warnings = %q, want %d", v.Warnings, tc.warn)
			}
		})
	}
}

// A command that outlives Timeout comes back promptly as an Error, and its children die with it.
func TestCommandRunTimeoutKillsProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	c := script(FormatDCGM, `sleep 60 & echo $! > "$1"; wait`, pidFile)
	c.Timeout = 300 * time.Millisecond
	start := time.Now()
	v := c.Run(t.Context(), gpu2, "node-a")
	if v.Result != Error || v.Message != "timed out after 300ms" {
		t.Fatalf("Run = %q %q, want Error \"timed out after 300ms\"", v.Result, v.Message)
	}
	// Generous: only a hang (the kill missing the group, waiting on the sleep) takes this long.
	if took := time.Since(start); took > waitDelay {
		t.Errorf("Run took %s after a 300ms timeout", took)
	}
	waitGone(t, readPID(t, pidFile))
}

func TestCommandRunContextCancelled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	// The file appears whole (mv), so the cancel never finds it empty.
	c := script(FormatDCGM, `sleep 60 & echo $! > "$1.tmp"; mv "$1.tmp" "$1"; wait`, pidFile)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		// Cancel once the child is running, so that the kill, not the start, is tested.
		for ctx.Err() == nil {
			if _, err := os.Stat(pidFile); err == nil {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	v := c.Run(ctx, gpu2, "node-a")
	if v.Result != Error || !strings.Contains(v.Message, "cancelled") {
		t.Fatalf("Run = %q %q, want Error naming the cancellation", v.Result, v.Message)
	}
	waitGone(t, readPID(t, pidFile))
}

func readPID(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// waitGone waits for pid to exit (a zombie awaiting its reaper counts as gone).
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return
		}
		// The state follows the parenthesised command name: "pid (comm) S ...".
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d still running after the command was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
