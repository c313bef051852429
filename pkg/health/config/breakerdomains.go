package config

import "fmt"

// BreakerDomain is a circuit-breaker budget per value of a node label (a rack, a switch, a node
// pool): besides the cluster's budget, the GPUs of the nodes sharing one value of Label may turn
// NoSchedule or NoExecute within the window only up to MaxFraction of that value's GPUs. One bad
// rack is then held at its own budget instead of eating the cluster's, and a wave across the
// cluster is still caught by the cluster's. A node without the label is under the cluster's
// budget only.
type BreakerDomain struct {
	// Label is a node label key, e.g. topology.kubernetes.io/rack.
	Label string `yaml:"label" json:"label"`
	// MaxFraction of one value's GPUs that may escalate within the window (0 < f ≤ 1).
	MaxFraction float64 `yaml:"maxFraction" json:"maxFraction"`
}

// MaxBreakerDomains is the most domain labels one breaker takes: each is a slot pool per value
// and one more admission (a Lease create) per escalation.
const MaxBreakerDomains = 4

func (c CircuitBreakerConfig) validateDomains(bad func(path, format string, args ...any)) {
	if len(c.Domains) > MaxBreakerDomains {
		bad("agent.circuitBreaker.domains", "at most %d domain labels, got %d", MaxBreakerDomains, len(c.Domains))
	}
	seen := map[string]bool{}
	for i, d := range c.Domains {
		path := fmt.Sprintf("agent.circuitBreaker.domains[%d]", i)
		if err := validLabelKey(d.Label); err != nil {
			bad(path+".label", "%q is not a label key: %v", d.Label, err)
		}
		if seen[d.Label] {
			bad(path+".label", "duplicate domain label %q", d.Label)
		}
		seen[d.Label] = true
		if f := d.MaxFraction; !(f > 0 && f <= 1) {
			bad(path+".maxFraction", "must be above 0 and at most 1, got %v", f)
		}
	}
}

// ValidateDomains checks Domains alone (the breaker controller's --domain flags), as Validate
// checks them in a HealthConfig.
func (c CircuitBreakerConfig) ValidateDomains() error {
	var errs FieldErrors
	c.validateDomains(func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Detail: fmt.Sprintf(format, args...)})
	})
	if len(errs) == 0 {
		return nil
	}
	return errs
}
