package simdriver_test

import (
	"encoding/json"
	"strings"
	"testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// Every GPU's board serial is one: what the scenario gives (the default after its list), as
// nvmlDeviceGetSerial answers it through go-nvml's real cgo path, as the simulated dcgmi lists it
// in DCGM 4.x's and 3.x's documents, and as the sim backend's devices carry it.
func TestSerialsAgree(t *testing.T) {
	longest := strings.Repeat("Z", sim.MaxSerialLength) // fills NVML's buffer but for the NUL
	scenario := `node: sd-node
gpus: {count: 4, serials: ["1650923012345", "` + longest + `"]}
`
	s := serve(t, scenario, "")
	sc, err := sim.ParseDriverScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n" + scenario))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"1650923012345", longest, sim.DefaultSerial("sd-node", 2), sim.DefaultSerial("sd-node", 3)}
	for i, d := range sc.Devices() {
		if d.Serial != want[i] {
			t.Errorf("sim backend: GPU %d serial %q, want %q", i, d.Serial, want[i])
		}
	}

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
	if len(rep.GPUs) != len(want) {
		t.Fatalf("NVML: %d GPUs, want %d", len(rep.GPUs), len(want))
	}
	for i, g := range rep.GPUs {
		if g.Device.Serial != want[i] {
			t.Errorf("NVML: GPU %d serial %q, want %q", i, g.Device.Serial, want[i])
		}
	}

	for _, i := range []int{1, 2} {
		gpu := string(rune('0' + i))
		r := dcgmi(t, s.root, "diag", "-r", "1", "-i", "gpu:"+gpu, "-j")
		var d4 struct {
			Groups []struct {
				Entities []struct {
					Serial string `json:"serial_num"`
				} `json:"entities"`
			} `json:"entity_groups"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &d4); err != nil || len(d4.Groups) != 1 || len(d4.Groups[0].Entities) != 1 ||
			d4.Groups[0].Entities[0].Serial != want[i] {
			t.Errorf("dcgmi 4.x, GPU %d: %v, want serial_num %q\n%s%s", i, err, want[i], r.stdout, r.stderr)
		}
		r = dcgmiVersion(t, s.root, sim.DCGMVersion3, "diag", "-r", "1", "-i", gpu, "-j")
		var d3 struct {
			Serials map[string]string `json:"GPU Device Serials"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &d3); err != nil || d3.Serials[gpu] != want[i] {
			t.Errorf("dcgmi 3.x, GPU %d: %v, want GPU Device Serials %q\n%s%s", i, err, want[i], r.stdout, r.stderr)
		}
	}
}
