package simdriver_test

import (
	"encoding/csv"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// Every GPU's VBIOS version is the node's one: what the scenario gives (or the default), as
// nvmlDeviceGetVbiosVersion answers it through go-nvml's real cgo path and to NVIDIA's own
// nvidia-smi, and as the sim backend's devices carry it.
func TestVBIOSAgrees(t *testing.T) {
	longest := "96.00.89.00.01-" + strings.Repeat("Z", sim.MaxVBIOSLength-15) // fills NVML's buffer but for the NUL
	for _, tc := range []struct {
		name, gpus, want string
	}{
		{"the default", "gpus: {count: 2}\n", sim.DefaultVBIOS},
		{"NVML's longest", "gpus: {count: 2, vbios: " + longest + "}\n", longest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scenario := "node: sd-node\n" + tc.gpus
			sc, err := sim.ParseDriverScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n" + scenario))
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range sc.Devices() {
				if d.VBIOS != tc.want {
					t.Errorf("sim backend: GPU %d VBIOS %q, want %q", d.Index, d.VBIOS, tc.want)
				}
			}

			s := serve(t, scenario, profiles[len(profiles)-1]) // the branch of the nvidia-smi below
			probe := startChild(t, "probe", s.root)
			var rep gpunvml.Report
			for l := range probe.lines {
				if err := json.Unmarshal([]byte(l), &rep); err != nil {
					t.Fatalf("%v: %s", err, l)
				}
			}
			if err := probe.wait(); err != nil {
				t.Fatal(err)
			}
			if len(rep.GPUs) != 2 {
				t.Fatalf("NVML: %d GPUs, want 2", len(rep.GPUs))
			}
			for i, g := range rep.GPUs {
				if g.Device.VBIOS != tc.want {
					t.Errorf("NVML: GPU %d VBIOS %q, want %q", i, g.Device.VBIOS, tc.want)
				}
			}
			if got := nvidiaSMIVBIOS(t, s.root); got != nil && (len(got) != 2 || got[0] != tc.want || got[1] != tc.want) {
				t.Errorf("nvidia-smi: VBIOS versions %q, want %q for both GPUs", got, tc.want)
			}
		})
	}
}

// nvidiaSMIVBIOS asks NVIDIA's nvidia-smi of the newest profile for the GPUs' VBIOS versions; nil
// when $GPUHEALTH_NVIDIA_DRIVERS is not set.
func nvidiaSMIVBIOS(t *testing.T, root string) []string {
	t.Helper()
	drivers := os.Getenv("GPUHEALTH_NVIDIA_DRIVERS")
	if drivers == "" {
		t.Log("$GPUHEALTH_NVIDIA_DRIVERS is not set: nvidia-smi not asked")
		return nil
	}
	cmd := exec.Command(filepath.Join(drivers, profiles[len(profiles)-1], "nvidia-smi"), "--query-gpu=vbios_version", "--format=csv,noheader")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(root, "usr/lib/x86_64-linux-gnu"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nvidia-smi: %v\n%s", err, out)
	}
	rows, err := csv.NewReader(strings.NewReader(string(out))).ReadAll()
	if err != nil {
		t.Fatalf("nvidia-smi: %v\n%s", err, out)
	}
	var got []string
	for _, r := range rows {
		got = append(got, strings.TrimSpace(strings.Join(r, ",")))
	}
	return got
}
