package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestRepairConditionDefaultsAndPolarity(t *testing.T) {
	for _, tc := range []struct {
		name, body     string
		typ, repair    string
		healthy        string
		defaultSection bool
	}{
		{"default: remediation's GPURebootRequired", "", "GPURebootRequired", "True", "False", true},
		{"named explicitly, still the default", "agent: {repairCondition: {type: GPURebootRequired}}\n", "GPURebootRequired", "True", "False", true},
		{"a Ready type: False asks for a repair", "agent: {repairCondition: {type: AcceleratedHardwareReady}}\n", "AcceleratedHardwareReady", "False", "True", false},
		{"a problem type: True asks", "agent: {repairCondition: {type: example.com/GPUNodeRepair}}\n", "example.com/GPUNodeRepair", "True", "False", false},
		{"a type whose name does not say", "agent: {repairCondition: {type: GPUNodeHealthy, repairStatus: \"False\"}}\n", "GPUNodeHealthy", "False", "True", false},
		{"a status YAML took for a boolean", "agent: {repairCondition: {type: GPUNodeHealthy, repairStatus: false}}\n", "GPUNodeHealthy", "False", "True", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustParse(t, tc.body).AgentSection().RepairCondition
			d := r.WithDefaults()
			if d.Type != tc.typ || d.RepairStatus != tc.repair || r.HealthyStatus() != tc.healthy || r.IsDefault() != tc.defaultSection {
				t.Errorf("%+v: defaults %+v, healthy %s, default %v; want %s asking with %s, healthy %s, default %v",
					r, d, r.HealthyStatus(), r.IsDefault(), tc.typ, tc.repair, tc.healthy, tc.defaultSection)
			}
		})
	}
}

func TestRepairConditionValidation(t *testing.T) {
	for _, tc := range []struct{ name, body, path, detail string }{
		{"not a condition type", "agent: {repairCondition: {type: \"GPU Ready\"}}\n", "agent.repairCondition.type", "not a condition type"},
		{"the kubelet's Ready", "agent: {repairCondition: {type: Ready}}\n", "agent.repairCondition.type", "written by the kubelet or by gpuhealth"},
		{"gpuhealth's own GPUUnhealthy", "agent: {repairCondition: {type: GPUUnhealthy}}\n", "agent.repairCondition.type", "another purpose"},
		{"an unknown status", "agent: {repairCondition: {type: AcceleratedHardwareReady, repairStatus: \"no\"}}\n", "agent.repairCondition.repairStatus", `"True" or "False"`},
		{"a Ready type asking with True", "agent: {repairCondition: {type: AcceleratedHardwareReady, repairStatus: \"True\"}}\n", "agent.repairCondition.repairStatus", "asks for a repair with status False"},
		{"GPURebootRequired asking with False", "agent: {repairCondition: {repairStatus: \"False\"}}\n", "agent.repairCondition.repairStatus", "GPURebootRequired asks for a repair with status True"},
		{"without the condition reporter", "agent: {reporters: [annotation, devicetaint], repairCondition: {type: AcceleratedHardwareReady}}\n", "agent.repairCondition.type", "lacks condition"},
		{"the breaker without devicetaint", "agent: {reporters: [condition], circuitBreaker: {enabled: true}, repairCondition: {type: AcceleratedHardwareReady}}\n", "agent.repairCondition.type", "lacks devicetaint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + tc.body))
			var fes config.FieldErrors
			if !errors.As(err, &fes) || !slices.ContainsFunc(fes, func(fe *config.FieldError) bool {
				return fe.Path == tc.path && strings.Contains(fe.Detail, tc.detail)
			}) {
				t.Fatalf("error %v, want %s: ...%s...", err, tc.path, tc.detail)
			}
		})
	}
	// What the engines need, accepted: the breaker with devicetaint, and the default without
	// the condition reporter (it is simply not written).
	mustParse(t, "agent: {circuitBreaker: {enabled: true}, repairCondition: {type: AcceleratedHardwareReady}}\n")
	mustParse(t, "agent: {reporters: [annotation], repairCondition: {type: GPURebootRequired}}\n")
}
