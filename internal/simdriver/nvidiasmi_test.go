package simdriver_test

import (
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// NVIDIA's own nvidia-smi (Debian's packages, fetched by hack/nvidia-drivers.sh; make unit sets
// $GPUHEALTH_NVIDIA_DRIVERS) lists the simulated GPUs and answers a query with the scenario's
// values, each branch's nvidia-smi on the profile of its branch.
func TestNvidiaSMI(t *testing.T) {
	drivers := os.Getenv("GPUHEALTH_NVIDIA_DRIVERS")
	if drivers == "" {
		t.Skip("$GPUHEALTH_NVIDIA_DRIVERS is not set: run hack/nvidia-drivers.sh (make unit does)")
	}
	for _, v := range profiles {
		t.Run(v, func(t *testing.T) {
			smi := filepath.Join(drivers, v, "nvidia-smi")
			if _, err := os.Stat(smi); err != nil {
				t.Fatal(err)
			}
			s := serve(t, fourGPUs, v)
			run := func(args ...string) string {
				cmd := exec.Command(smi, args...)
				cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(s.root, "usr/lib/x86_64-linux-gnu"))
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("nvidia-smi %v: %v\n%s", args, err, out)
				}
				return string(out)
			}
			var want strings.Builder
			for i := range 4 {
				fmt.Fprintf(&want, "GPU %d: %s (UUID: %s)\n", i, sim.DefaultModel, sim.GPUUUID("sd-node", i))
			}
			if got := run("-L"); got != want.String() {
				t.Errorf("nvidia-smi -L:\n%s\nwant:\n%s", got, want.String())
			}
			if v < "535" {
				return // the query below is checked on the branches the issue names (535, 550)
			}
			out := run("--query-gpu=index,uuid,name,pci.bus_id,temperature.gpu,ecc.errors.uncorrected.volatile.total", "--format=csv")
			rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
			if err != nil || len(rows) != 5 {
				t.Fatalf("--query-gpu: %v, %d rows:\n%s", err, len(rows), out)
			}
			for i, row := range rows[1:] {
				for j := range row {
					row[j] = strings.TrimSpace(row[j])
				}
				temp, ecc := "35", "0"
				if i == 1 {
					temp = "97"
				}
				if i == 3 {
					ecc = "2"
				}
				wantRow := []string{fmt.Sprint(i), sim.GPUUUID("sd-node", i), sim.DefaultModel, fmt.Sprintf("00000000:%02X:00.0", 0x10+i), temp, ecc}
				if strings.Join(row, ",") != strings.Join(wantRow, ",") {
					t.Errorf("row %d = %v, want %v", i, row, wantRow)
				}
			}
		})
	}
}

// `nvidia-smi --gpu-reset` resets a simulated GPU (its volatile ECC totals clear), and is refused
// with NVML's IN_USE while another process holds the GPUs, as a real reset is.
func TestNvidiaSMIReset(t *testing.T) {
	drivers := os.Getenv("GPUHEALTH_NVIDIA_DRIVERS")
	if drivers == "" {
		t.Skip("$GPUHEALTH_NVIDIA_DRIVERS is not set: run hack/nvidia-drivers.sh (make unit does)")
	}
	for _, v := range []string{"535.261.03", "550.163.01"} {
		t.Run(v, func(t *testing.T) {
			s := serve(t, fourGPUs, v)
			smi := func(args ...string) (string, int) {
				cmd := exec.Command(filepath.Join(drivers, v, "nvidia-smi"), args...)
				cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(s.root, "usr/lib/x86_64-linux-gnu"))
				out, _ := cmd.CombinedOutput()
				return string(out), cmd.ProcessState.ExitCode()
			}
			uncorrected := func() string {
				out, _ := smi("--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader", "-i", "3")
				return strings.TrimSpace(out)
			}
			if got := uncorrected(); got != "2" {
				t.Fatalf("GPU 3 uncorrected before the reset: %q", got)
			}
			if out, code := smi("--gpu-reset", "-i", "3"); code != 0 || !strings.Contains(out, "00000000:13:00.0 was successfully reset") {
				t.Fatalf("nvidia-smi --gpu-reset: exit %d\n%s", code, out)
			}
			if got := uncorrected(); got != "0" {
				t.Errorf("GPU 3 uncorrected after the reset: %q, want 0", got)
			}
			// Another process holds the GPUs: the reset is refused and changes nothing.
			if err := simdriver.Inject(s.root, "{gpu: 3, ecc: {uncorrectedVolatile: 1}}"); err != nil {
				t.Fatal(err)
			}
			holder := startChild(t, "watch", s.root)
			for gpu := range s.registered {
				if gpu == 3 {
					break
				}
			}
			if out, code := smi("--gpu-reset", "-i", "3"); code != 19 { // NVML_ERROR_IN_USE
				t.Errorf("nvidia-smi --gpu-reset while held: exit %d, want 19 (in use)\n%s", code, out)
			}
			if got := uncorrected(); got != "1" {
				t.Errorf("GPU 3 uncorrected after the refused reset: %q, want 1", got)
			}
			holder.stop(t)
		})
	}
}
