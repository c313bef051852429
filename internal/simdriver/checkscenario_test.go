package simdriver_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/simdriver"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

func TestCheckScenarioRefusesWhatNoDriverServes(t *testing.T) {
	for event, want := range map[string]string{
		"{at: 1s, reboot: true}": "reboot: a driver cannot reboot its node",
		"{at: 1s, kmsg: \"NVRM: Xid (PCI:0000:10:00): 79, GPU has fallen off the bus.\"}": "kmsg: the simulated driver serves NVML",
		"{at: 1s, peerFault: {node: n0, gpu: 2, xid: 149}}":                               "peerFault: a driver knows nothing of other nodes",
	} {
		sc, err := sim.ParseDriverScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n1\ngpus: {count: 1}\nevents:\n  - " + event + "\n"))
		if err != nil {
			t.Fatalf("%s: %v", event, err)
		}
		if err := simdriver.CheckScenario(sc); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: CheckScenario %v, want %q", event, err, want)
		}
	}
}

// Diagnostic states are the simulator's to hold (it is the node's DCGM host engine): a driver
// scenario takes them.
func TestCheckScenarioTakesDiagnosticStates(t *testing.T) {
	events := "  - {at: 1s, gpu: 0, latent: {xid: 48}}\n"
	for _, w := range sim.DiagWords {
		events += "  - {at: 2s, gpu: 0, diag: " + string(w) + "}\n"
	}
	sc, err := sim.ParseDriverScenario([]byte("apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: n1\ngpus: {count: 1}\nevents:\n" + events))
	if err != nil {
		t.Fatal(err)
	}
	if err := simdriver.CheckScenario(sc); err != nil {
		t.Errorf("CheckScenario = %v", err)
	}
}
