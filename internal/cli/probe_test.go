package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// skipWithDriver skips a test that expects no NVIDIA driver on a machine that has one.
func skipWithDriver(t *testing.T) {
	t.Helper()
	if b, err := gpunvml.OpenSystem(); err == nil {
		_ = b.Close()
		t.Skip("an NVIDIA driver is installed here")
	}
}

// Without the driver, each NVML command fails with exit 1 and one clear line, never a panic.
func TestNVMLCommandsWithoutDriver(t *testing.T) {
	skipWithDriver(t)
	tests := []struct {
		name string
		args []string
	}{
		{"probe", []string{"probe"}},
		{"probe json", []string{"probe", "--output", "json"}},
		{"probe raw", []string{"probe", "--raw"}},
		{"watch", []string{"watch"}},
		{"watch nvml json", []string{"watch", "--backend", "nvml", "--output", "json"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Execute(context.Background(), tc.args, &stdout, &stderr)
			if code != cli.ExitFailure {
				t.Errorf("exit code = %d, want %d", code, cli.ExitFailure)
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], "NVML library not found: is the NVIDIA driver installed?") {
				t.Errorf("stderr = %q, want one line saying the NVML library was not found", stderr.String())
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

func TestProbeBadOutput(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := cli.Execute(context.Background(), []string{"probe", "--output", "yaml"}, &stdout, &stderr); code != cli.ExitBadInput {
		t.Errorf("exit code = %d, want %d (stderr %q)", code, cli.ExitBadInput, stderr.String())
	}
}
