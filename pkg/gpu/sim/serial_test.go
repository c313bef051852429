package sim_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

var defaultSerialShape = regexp.MustCompile(`^SIM[0-9A-Z]{10}$`)

// Default serials are stable, shaped like a 13-character serial, and name a board once: no two
// GPUs of one node, nor of many nodes, share one, and GPU 0 of one node is not GPU 0 of another.
func TestDefaultSerialsAreStableAndDistinct(t *testing.T) {
	seen := map[string]string{}
	for n := range 2000 {
		node := fmt.Sprintf("node-%d", n)
		for i := range sim.MaxGPUs {
			s := sim.DefaultSerial(node, i)
			if !defaultSerialShape.MatchString(s) {
				t.Fatalf("DefaultSerial(%s, %d) = %q, want SIM and 10 base-36 digits", node, i, s)
			}
			at := fmt.Sprintf("%s GPU %d", node, i)
			if other, dup := seen[s]; dup {
				t.Fatalf("serial %s of %s is %s's too", s, at, other)
			}
			seen[s] = at
		}
	}
	if sim.DefaultSerial("sim-node-0", 0) == sim.DefaultSerial("sim-node-1", 0) {
		t.Errorf("GPU 0 of two nodes has one serial")
	}
	// Pinned: a GPU's serial names it across restarts, so the rule does not change.
	if got, want := sim.DefaultSerial("sim-node-0", 0), "SIM6GUV6KH200"; got != want {
		t.Errorf("DefaultSerial(sim-node-0, 0) = %s, want %s", got, want)
	}
	if got, want := sim.DefaultSerial("sim-node-0", 35), "SIM6GUV6KH20Z"; got != want {
		t.Errorf("DefaultSerial(sim-node-0, 35) = %s, want %s", got, want)
	}
}

func TestScenarioSerials(t *testing.T) {
	sc := mustParseScenario(t, scenario("gpus: {count: 4, migInstances: {\"1\": 2}, serials: [\"1650923012345\", B.2_x-Y]}\n"))
	want := []string{"1650923012345", "B.2_x-Y", sim.DefaultSerial("n1", 2), sim.DefaultSerial("n1", 3)}
	for i, w := range want {
		if got := sc.Serial(i); got != w {
			t.Errorf("Serial(%d) = %q, want %q", i, got, w)
		}
	}
	for _, d := range sc.Devices() {
		switch {
		case d.MIG != nil && d.Serial != "":
			t.Errorf("MIG instance %s has serial %q, want none", d.UUID, d.Serial)
		case d.MIG == nil && d.Serial != want[d.Index]:
			t.Errorf("GPU %d's device has serial %q, want %q", d.Index, d.Serial, want[d.Index])
		}
	}
	// The file's serials go with the scenario to another node; the defaults follow the node.
	moved := sc.OnNode("n2")
	if got := moved.Serial(0); got != want[0] {
		t.Errorf("Serial(0) on another node = %q, want the file's %q", got, want[0])
	}
	if got, w := moved.Serial(2), sim.DefaultSerial("n2", 2); got != w {
		t.Errorf("Serial(2) on another node = %q, want that node's default %q", got, w)
	}
	// A serial of a GPU the driver does not answer for is allowed, and goes to no device.
	sc = mustParseScenario(t, scenario("gpus: {count: 2, missing: [1], serials: [S0, S1]}\n"))
	if devs, ph := sc.Devices(), sc.Placeholders(); len(devs) != 1 || devs[0].Serial != "S0" || len(ph) != 1 || ph[0].Serial != "" {
		t.Errorf("devices %+v, placeholders %+v; want GPU 0 with S0 and a placeholder without a serial", devs, ph)
	}
	// The sim backend's DCGM diagnostic names the same board.
	b := sim.New(sc, sim.Options{Virtual: true})
	out, _, err := b.Diagnose(t.Context(), sim.GPUUUID("n1", 0))
	if err != nil || !strings.Contains(string(out), `"serial_num" : "S0"`) {
		t.Errorf("Diagnose: %v\n%s\nwant serial_num S0", err, out)
	}
}

func TestScenarioSerialErrors(t *testing.T) {
	long := strings.Repeat("7", sim.MaxSerialLength+1)
	cases := []struct {
		name string
		gpus string
		want []string
	}{
		{"more serials than GPUs", "gpus: {count: 2, serials: [a, b, c]}\n", []string{"gpus.serials: 3 serials for 2 GPUs"}},
		{"an empty serial", "gpus: {count: 2, serials: [a, \"\"]}\n", []string{"gpus.serials[1]: must not be empty"}},
		{"a serial too long", "gpus: {count: 2, serials: [" + long + "]}\n", []string{"gpus.serials[0]:", "30 characters, at most 29"}},
		{"a space", "gpus: {count: 2, serials: [\"16509 23\"]}\n", []string{"gpus.serials[0]:", `has ' '`}},
		{"a slash", "gpus: {count: 2, serials: [ok, a/b]}\n", []string{"gpus.serials[1]:", `has '/'`}},
		{"not ASCII", "gpus: {count: 2, serials: [\"é1\"]}\n", []string{"gpus.serials[0]:", "only ASCII letters, digits"}},
		{"one serial twice", "gpus: {count: 3, serials: [A1, B2, A1]}\n", []string{"gpus.serials[2]:", `"A1" is GPU 0's serial already`}},
		{"not a list", "gpus: {count: 2, serials: A1}\n", []string{"line 4"}},
		{"not strings", "gpus: {count: 2, serials: [{a: 1}]}\n", []string{"line 4"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(scenario(tc.gpus)))
			wantOneLineError(t, err, tc.want...)
		})
	}
}
