package simdriver_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
)

// A C consumer compiled against go-nvml's nvml.h checks that each versioned variant writes
// exactly its own struct layout (c/layout_check.c): DataDog's fake corrupted go-nvml's heap by
// writing a newer struct into an older buffer.
func TestLayouts(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "layout_check")
	cc := exec.Command("gcc", "-O1", "-Wall", "-Werror", "-Wno-deprecated-declarations", "-I", filepath.Join(strings.TrimSpace(string(out)), "pkg/nvml"),
		"-o", bin, "c/layout_check.c", "-ldl")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	for _, v := range []string{"470.256.02", "550.163.01"} {
		t.Run(v, func(t *testing.T) {
			s := serve(t, "node: n\ngpus: {count: 2, migInstances: {\"0\": 2}}\nevents:\n  - {at: 0s, gpu: 0, fabric: inProgress}\n", v)
			cmd := exec.Command(bin, filepath.Join(s.root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"))
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := bufio.NewScanner(stdout)
			if !lines.Scan() || lines.Text() != "registered" {
				_ = cmd.Wait()
				t.Fatalf("layout_check: %q: %s", lines.Text(), stderr.String())
			}
			for _, ev := range []string{"{gpu: 0, xid: 79}", "{gpu: 0, xid: 94, gpuInstance: 2}"} {
				if err := simdriver.Inject(s.root, ev); err != nil {
					t.Fatal(err)
				}
			}
			_, _ = stdin.Write([]byte("go\n"))
			ok := lines.Scan() && lines.Text() == "ok"
			if err := cmd.Wait(); err != nil || !ok {
				t.Fatalf("layout_check: %v: %s", err, stderr.String())
			}
		})
	}
	_ = os.Remove(bin)
}
