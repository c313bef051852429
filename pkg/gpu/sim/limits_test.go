package sim_test

import (
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

func TestScenarioSizeIsBounded(t *testing.T) {
	head := "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\n"
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"duration too long", "duration: 100000h\n", "longer than the longest scenario"},
		{"event too late", "events:\n- {at: 200h, gpu: 0, xid: 79}\n", "past the longest scenario"},
		{"too many signals in all", "events:\n" + strings.Repeat("- {at: 1s, gpu: 0, xid: 79, repeat: 10000000}\n", 11), "more than 100000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(head + tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseScenario error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := sim.ParseScenario([]byte(head + "duration: 168h\nevents:\n- {at: 1s, gpu: 0, xid: 79, repeat: 10000000}\n")); err != nil {
		t.Fatalf("a scenario at the limits was refused: %v", err)
	}
}
