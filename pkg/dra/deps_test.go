package dra_test

import (
	"os/exec"
	"strings"
	"testing"
)

// goListDeps returns the packages pkg depends on, as `go list -deps` prints them.
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestNoClientGo holds the promise of the package doc: the taint and health mapping a DRA driver
// needs pulls no client-go, and the health core pulls nothing of Kubernetes at all.
func TestNoClientGo(t *testing.T) {
	for _, tc := range []struct {
		pkg, forbidden string
	}{
		{"github.com/gpuhealth/gpuhealth/pkg/dra", "k8s.io/client-go/"},
		{"github.com/gpuhealth/gpuhealth/pkg/dra", "google.golang.org/grpc"},
		{"github.com/gpuhealth/gpuhealth/pkg/health/...", "k8s.io/"},
		{"github.com/gpuhealth/gpuhealth/pkg/api/...", "k8s.io/"},
	} {
		for _, dep := range goListDeps(t, tc.pkg) {
			if strings.HasPrefix(dep, tc.forbidden) {
				t.Errorf("%s depends on %s (nothing under %s is allowed)", tc.pkg, dep, tc.forbidden)
			}
		}
	}
}
