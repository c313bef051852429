package simdriver_test

import (
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
