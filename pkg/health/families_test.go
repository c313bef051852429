package health_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestConditionTypeFamily(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    health.ConditionType
		want health.Family
	}{
		{"an operator's drain is no fault", health.ConditionAdmin, health.FamilyNone},
		{"XID", health.ConditionXID, health.FamilyXID},
		{"repeated XIDs", health.ConditionXIDRepeat, health.FamilyXID},
		{"SRAM", health.ConditionSRAMThreshold, health.FamilyMemory},
		{"fabric", health.ConditionFabricHealth, health.FamilyNVLink},
		{"missing GPU", health.ConditionGPUMissing, health.FamilyPresence},
		{"reset required", health.ConditionGPUResetRequired, health.FamilyRecoveryAction},
		{"replace", health.ConditionReplaceGPU, health.FamilyRepair},
		{"a type the library does not know", health.ConditionType("Embedder"), health.FamilyOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.t.Family(); got != tc.want {
				t.Errorf("%s.Family() = %d, want %d", tc.t, got, tc.want)
			}
		})
	}
}
