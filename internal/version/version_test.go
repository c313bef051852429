package version_test

import (
	"runtime"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/internal/version"
)

func TestString(t *testing.T) {
	if got := version.String(); !strings.HasPrefix(got, version.Version+" (") || !strings.Contains(got, runtime.Version()) {
		t.Errorf("String() = %q, want the version and %s", got, runtime.Version())
	}
}
