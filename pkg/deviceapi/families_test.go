package deviceapi_test

import (
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Every family of the library has its condition type.
func TestFamilyTypesCoverFamilies(t *testing.T) {
	if got, want := len(deviceapi.FamilyTypes()), int(health.FamilyOther-health.FamilyXID)+1; got != want {
		t.Fatalf("%d family types for %d families", got, want)
	}
	if f, ok := deviceapi.Family(health.ConditionType("Embedder")); !ok || f != deviceapi.TypeOther {
		t.Errorf("an unknown type's family = %q, %v; want %q", f, ok, deviceapi.TypeOther)
	}
}
