package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
)

func TestBreakerControllerConfig(t *testing.T) {
	const header = "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\n"
	write := func(body string) string {
		path := filepath.Join(t.TempDir(), "healthconfig.yaml")
		if err := os.WriteFile(path, []byte(header+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if s, _, err := fleetSettings(""); s != nil || err != nil {
		t.Errorf("no --config: %+v, %v; want the judge off", s, err)
	}
	if s, _, err := fleetSettings(write("agent: {reporters: [annotation]}\n")); s != nil || err != nil {
		t.Errorf("a HealthConfig without fleet: %+v, %v; want the judge off", s, err)
	}
	s, _, err := fleetSettings(write("fleet:\n  sharedCauses: {enabled: true, every: 30s, labels: [rack], alpha: 0.01}\n"))
	if err != nil || s == nil || s.Every != 30*time.Second || len(s.Labels) != 1 || s.Judge != (sharedcause.Options{Alpha: 0.01}) {
		t.Errorf("fleet.sharedCauses on: %+v, %v", s, err)
	}
	if _, r, err := fleetSettings(write("fleet:\n  records: {enabled: true, maxRecords: 10}\n")); err != nil || !r.IsEnabled() || *r.MaxRecords != 10 {
		t.Errorf("fleet.records on: %+v, %v", r, err)
	}
	// A file that does not load or validate is bad input naming the file and the field.
	bad := write("fleet:\n  sharedCauses: {enabled: true, every: 1s}\n")
	var out, errOut bytes.Buffer
	code := Execute(context.Background(), []string{"breaker", "controller", "--config", bad, "--kubeconfig", "/nonexistent"}, &out, &errOut)
	if code != 2 || !strings.Contains(errOut.String(), bad+": fleet.sharedCauses.every: must be at least 10s") {
		t.Errorf("a bad --config: exit %d, %q; want exit 2 naming the file and the field", code, errOut.String())
	}
	if _, _, err := fleetSettings(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing --config: %v, want an error naming it", err)
	}
}
