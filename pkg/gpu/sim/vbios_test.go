package sim_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// A node's GPUs share one VBIOS version: the file's, or DefaultVBIOS; MIG instances have none,
// and a scenario replayed on another node keeps it.
func TestScenarioVBIOS(t *testing.T) {
	longest := strings.Repeat("9", sim.MaxVBIOSLength)
	for _, tc := range []struct {
		name, gpus, want string
	}{
		{"the default", "gpus: {count: 3, migInstances: {\"1\": 2}}\n", sim.DefaultVBIOS},
		{"the file's", "gpus: {count: 3, migInstances: {\"1\": 2}, vbios: 96.00.74.00.0B}\n", "96.00.74.00.0B"},
		{"one YAML would take for a number", "gpus: {count: 3, vbios: 96.00}\n", "96.00"},
		{"NVML's longest", "gpus: {count: 3, vbios: " + longest + "}\n", longest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := mustParseScenario(t, scenario(tc.gpus))
			if sc.VBIOS != tc.want || sc.OnNode("n2").VBIOS != tc.want {
				t.Errorf("VBIOS %q (on another node %q), want %q", sc.VBIOS, sc.OnNode("n2").VBIOS, tc.want)
			}
			gpus := 0
			for _, d := range sc.Devices() {
				switch {
				case d.MIG != nil && d.VBIOS != "":
					t.Errorf("MIG instance %s has VBIOS %q, want none", d.UUID, d.VBIOS)
				case d.MIG == nil:
					gpus++
					if d.VBIOS != tc.want {
						t.Errorf("GPU %d's device has VBIOS %q, want %q", d.Index, d.VBIOS, tc.want)
					}
				}
			}
			if gpus != 3 {
				t.Errorf("%d GPUs, want 3", gpus)
			}
		})
	}
}

func TestScenarioVBIOSErrors(t *testing.T) {
	long := strings.Repeat("9", sim.MaxVBIOSLength+1)
	cases := []struct {
		name string
		gpus string
		want []string
	}{
		{"empty", "gpus: {count: 2, vbios: \"\"}\n", []string{"gpus.vbios: must not be empty"}},
		{"too long", "gpus: {count: 2, vbios: " + long + "}\n", []string{"gpus.vbios:", "32 characters, at most 31"}},
		{"a space", "gpus: {count: 2, vbios: \"96.00 89\"}\n", []string{"gpus.vbios:", `has ' '`}},
		{"a tab", "gpus: {count: 2, vbios: \"96.00\\t89\"}\n", []string{"gpus.vbios:", `has '\t'`}},
		{"not ASCII", "gpus: {count: 2, vbios: \"96.00.89·\"}\n", []string{"gpus.vbios:", "only printable ASCII"}},
		{"a list", "gpus: {count: 2, vbios: [96.00.89.00.01]}\n", []string{"line 4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(scenario(tc.gpus)))
			wantOneLineError(t, err, tc.want...)
		})
	}
}
