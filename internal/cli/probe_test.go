package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// skipWithDriver skips a test that expects no NVIDIA driver on a machine that has one.
func skipWithDriver(t *testing.T) {
	t.Helper()
	if b, err := gpunvml.OpenDriverRoot(gpunvml.DefaultDriverRoot, nil); err == nil {
		_ = b.Close()
		t.Skip("an NVIDIA driver is installed here")
	}
}

// Without the driver, each NVML command fails with exit 1 and one clear line naming the one case
// that holds, never a panic: no library under the driver root (with the paths searched), a file
// the loader refuses (with the loader's words), or no root at all.
func TestNVMLCommandsWithoutDriver(t *testing.T) {
	skipWithDriver(t)
	empty := t.TempDir()
	garbage := t.TempDir()
	if err := os.MkdirAll(filepath.Join(garbage, "usr/lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(garbage, "usr/lib64/libnvidia-ml.so.1"), []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"probe", []string{"probe"}, []string{"NVML library not found under driver root /", "/usr/lib64/libnvidia-ml.so.1"}},
		{"probe json", []string{"probe", "--output", "json"}, []string{"NVML library not found"}},
		{"probe raw", []string{"probe", "--raw"}, []string{"NVML library not found"}},
		{"watch", []string{"watch"}, []string{"NVML library not found"}},
		{"watch nvml json", []string{"watch", "--backend", "nvml", "--output", "json"}, []string{"NVML library not found"}},
		{"empty driver root", []string{"probe", "--driver-root", empty},
			[]string{"NVML library not found under driver root " + empty, "(searched " + filepath.Join(empty, "usr/lib")}},
		{"library paths", []string{"probe", "--driver-root", empty, "--nvml-library-paths", "/opt/nv,usr/local/lib"},
			[]string{"(searched " + filepath.Join(empty, "opt/nv/libnvidia-ml.so.1") + ", " + filepath.Join(empty, "usr/local/lib/libnvidia-ml.so.1") + ")"}},
		{"missing driver root", []string{"probe", "--driver-root", filepath.Join(empty, "nope")}, []string{"NVML library not found", "the driver root does not exist"}},
		{"not a library", []string{"watch", "--driver-root", garbage}, []string{"NVML library cannot be loaded: " + filepath.Join(garbage, "usr/lib64/libnvidia-ml.so.1"), "not an ELF shared library"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Execute(context.Background(), tc.args, &stdout, &stderr)
			if code != cli.ExitFailure {
				t.Errorf("exit code = %d, want %d", code, cli.ExitFailure)
			}
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			if len(lines) != 1 {
				t.Errorf("stderr = %q, want one line", stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr = %q, want it to say %q", stderr.String(), w)
				}
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
