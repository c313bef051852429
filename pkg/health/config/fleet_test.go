package config_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestSharedCausesIsOffByDefault(t *testing.T) {
	c := mustParse(t, "")
	s := c.Fleet.SharedCauses
	if s.IsEnabled() || s.Period() != time.Minute {
		t.Errorf("default: enabled %v, every %v; want off, 1m", s.IsEnabled(), s.Period())
	}
	// The judge's fields stay unset: the judge's own defaults apply (one source of them).
	if s.Window != nil || s.MinFaultyGPUs != nil || s.MinRatio != nil || s.Alpha != nil || s.Labels != nil {
		t.Errorf("default %+v: want the judge's fields unset", s)
	}
}

func TestSharedCausesParse(t *testing.T) {
	c := mustParse(t, `fleet:
  sharedCauses:
    enabled: true
    every: 30s
    window: 2h
    labels: [topology.kubernetes.io/rack, pool]
    minFaultyGPUs: 8
    minRatio: 3.5
    alpha: 0.01
`)
	s := c.Fleet.SharedCauses
	if !s.IsEnabled() || s.Period() != 30*time.Second || time.Duration(*s.Window) != 2*time.Hour ||
		!slices.Equal(s.Labels, []string{"topology.kubernetes.io/rack", "pool"}) ||
		*s.MinFaultyGPUs != 8 || *s.MinRatio != 3.5 || *s.Alpha != 0.01 {
		t.Errorf("parsed %+v", s)
	}
}

func TestSharedCausesValidation(t *testing.T) {
	many := make([]string, config.MaxSharedCausesLabels+1)
	for i := range many {
		many[i] = "l" + strings.Repeat("x", i+1)
	}
	for _, tc := range []struct {
		name, body, path, detail string
	}{
		{"every too short", "every: 5s", "fleet.sharedCauses.every", "at least 10s"},
		{"a bare number", "every: 60", "", "not a duration"},
		{"window zero", "window: 0s", "fleet.sharedCauses.window", "must be positive"},
		{"window negative", "window: -1h", "fleet.sharedCauses.window", "must be positive"},
		{"not a label key", "labels: ['rack!']", "fleet.sharedCauses.labels[0]", "not a label key"},
		{"an empty label", "labels: ['']", "fleet.sharedCauses.labels[0]", "not a label key"},
		{"a duplicate label", "labels: [rack, rack]", "fleet.sharedCauses.labels[1]", "duplicate"},
		{"too many labels", "labels: [" + strings.Join(many, ", ") + "]", "fleet.sharedCauses.labels", "at most 16"},
		{"one faulty GPU", "minFaultyGPUs: 1", "fleet.sharedCauses.minFaultyGPUs", "2 or more"},
		{"ratio below one", "minRatio: 0.5", "fleet.sharedCauses.minRatio", "1 or more"},
		{"ratio NaN", "minRatio: .nan", "fleet.sharedCauses.minRatio", "1 or more"},
		{"ratio infinite", "minRatio: .inf", "fleet.sharedCauses.minRatio", "1 or more"},
		{"alpha zero", "alpha: 0", "fleet.sharedCauses.alpha", "above 0 and at most 0.5"},
		{"alpha above a half", "alpha: 0.6", "fleet.sharedCauses.alpha", "above 0 and at most 0.5"},
		{"alpha NaN", "alpha: .nan", "fleet.sharedCauses.alpha", "above 0"},
		{"an unknown field", "minFaultyNodes: 3", "", "minFaultyNodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + "fleet:\n  sharedCauses:\n    " + tc.body + "\n"))
			if err == nil {
				t.Fatal("parsed; want an error")
			}
			if tc.path == "" { // a decoding error, not a field error: it names the field
				if !strings.Contains(err.Error(), tc.detail) {
					t.Errorf("error %v, want it to name %s", err, tc.detail)
				}
				return
			}
			if got, ok := detailsByPath(err)[tc.path]; !ok || !strings.Contains(got, tc.detail) {
				t.Errorf("error %v, want %s: ...%s...", err, tc.path, tc.detail)
			}
		})
	}
	// The bounds themselves are fine.
	mustParse(t, "fleet:\n  sharedCauses: {every: 10s, minFaultyGPUs: 2, minRatio: 1, alpha: 0.5, labels: ["+strings.Join(many[:config.MaxSharedCausesLabels], ", ")+"]}\n")
}
