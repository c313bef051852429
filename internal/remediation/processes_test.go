package remediation

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDeviceHolders: the processes with exactly the GPU's device file open, by pid, this one
// left out; a process whose fds cannot be read is skipped.
func TestDeviceHolders(t *testing.T) {
	proc := t.TempDir()
	mk := func(pid, comm string, fds ...string) {
		dir := filepath.Join(proc, pid, "fd")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, target := range fds {
			if err := os.Symlink(target, filepath.Join(dir, string(rune('3'+i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("4321", "nv-hostengine", "/dev/nvidiactl", "/dev/nvidia1")
	mk("77", "dcgm-exporter", "/dev/nvidia1", "socket:[1]")
	mk("900", "python", "/dev/nvidia10")  // another GPU
	mk("55", "gpuhealth", "/dev/nvidia1") // this process
	mk("66", "persistenced", "/dev/nvidiactl")
	if err := os.MkdirAll(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := DeviceHolders(proc, 1, 55)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"77 (dcgm-exporter)", "4321 (nv-hostengine)"}; !slices.Equal(got, want) {
		t.Errorf("DeviceHolders = %q, want %q", got, want)
	}
	if _, err := DeviceHolders(filepath.Join(proc, "missing"), 1, 0); err == nil {
		t.Error("DeviceHolders of a missing /proc: no error")
	}
}
