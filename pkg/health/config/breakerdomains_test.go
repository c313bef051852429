package config_test

import (
	"errors"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestBreakerDomainsParse(t *testing.T) {
	c := mustParse(t, "agent:\n  circuitBreaker:\n    enabled: true\n    domains:\n    - {label: topology.kubernetes.io/rack, maxFraction: 0.25}\n    - {label: pool, maxFraction: 1}\n")
	got := c.Agent.CircuitBreaker.Domains
	want := []config.BreakerDomain{{Label: "topology.kubernetes.io/rack", MaxFraction: 0.25}, {Label: "pool", MaxFraction: 1}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("domains %+v, want %+v", got, want)
	}
}

func TestBreakerDomainsValidation(t *testing.T) {
	cases := []struct {
		name, domains, path string
	}{
		{"not a label key", "[{label: 'rack!', maxFraction: 0.2}]", "agent.circuitBreaker.domains[0].label"},
		{"empty label", "[{label: '', maxFraction: 0.2}]", "agent.circuitBreaker.domains[0].label"},
		{"duplicate label", "[{label: rack, maxFraction: 0.2}, {label: rack, maxFraction: 0.3}]", "agent.circuitBreaker.domains[1].label"},
		{"fraction zero", "[{label: rack, maxFraction: 0}]", "agent.circuitBreaker.domains[0].maxFraction"},
		{"fraction above one", "[{label: rack, maxFraction: 1.5}]", "agent.circuitBreaker.domains[0].maxFraction"},
		{"fraction NaN", "[{label: rack, maxFraction: .nan}]", "agent.circuitBreaker.domains[0].maxFraction"},
		{"too many labels", "[{label: a, maxFraction: 0.1}, {label: b, maxFraction: 0.1}, {label: c, maxFraction: 0.1}, {label: d, maxFraction: 0.1}, {label: e, maxFraction: 0.1}]",
			"agent.circuitBreaker.domains"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(header + "agent:\n  circuitBreaker:\n    domains: " + tc.domains + "\n"))
			var fes config.FieldErrors
			if !errors.As(err, &fes) {
				t.Fatalf("error %v, want field errors", err)
			}
			var paths []string
			for _, e := range fes {
				paths = append(paths, e.Path)
				if e.Path == tc.path {
					return
				}
			}
			t.Fatalf("field paths %q, want %q among them", paths, tc.path)
		})
	}
}
