package nvsentinel_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
)

// Every family of the library has its checkName.
func TestChecksCoverFamilies(t *testing.T) {
	if got, want := len(nvsentinel.Checks()), int(health.FamilyOther-health.FamilyXID)+1; got != want {
		t.Fatalf("%d checkNames for %d families", got, want)
	}
	if name, ok := nvsentinel.CheckName(health.ConditionType("Embedder"), nil); !ok || name != nvsentinel.CheckOther {
		t.Errorf("an unknown type's checkName = %q, %v; want %q", name, ok, nvsentinel.CheckOther)
	}
}
