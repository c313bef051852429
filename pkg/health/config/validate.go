package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Validation: every problem of a file, each at its field path. Each section checks its own
// fields (checks.go, xids.go, repeats.go, agent.go, ...).

// FieldError is a validation error at a field path such as xids.overrides[1].severity.
type FieldError struct {
	Path   string
	Detail string
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Detail }

// FieldErrors is every validation problem of a file, reported on one line.
type FieldErrors []*FieldError

func (es FieldErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap lets errors.As find each *FieldError.
func (es FieldErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// Validate checks every field and returns all problems as FieldErrors, or nil.
func (c *HealthConfig) Validate() error {
	var errs FieldErrors
	bad := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Detail: fmt.Sprintf(format, args...)})
	}
	if c.APIVersion != APIVersion {
		bad("apiVersion", "must be %q, got %q", APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		bad("kind", "must be %q, got %q", Kind, c.Kind)
	}
	if _, err := health.PolicyForProfile(c.Profile); err != nil {
		bad("profile", "%v", err)
	}
	if c.SampleInterval != nil && time.Duration(*c.SampleInterval) < MinSampleInterval {
		bad("sampleInterval", "must be at least %v, got %v", MinSampleInterval, time.Duration(*c.SampleInterval))
	}
	if c.QuietPeriod != nil && time.Duration(*c.QuietPeriod) <= 0 {
		bad("quietPeriod", "must be positive, got %v", time.Duration(*c.QuietPeriod))
	}
	c.XIDs.validate(bad)
	c.Checks.validate(bad)
	c.Repeats.validate(c.Profile, bad)
	if e := c.Escalation; e != nil {
		e.validate(bad)
	}
	c.Inventory.validate(bad)
	c.Agent.validate(bad)
	c.KernelLog.validate(bad)
	c.Remediation.validate(c.Agent.NoExecute, bad)
	c.Agent.NVSentinel.validateRepairer(c.Remediation.Enabled, bad)
	c.Agent.RepairCondition.validate(c.Agent, bad)
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// positive reports whether v is a usable rate limit: above zero and not NaN (YAML's .nan, which
// no rate is ever above, would turn the check off without saying so).
func positive(v float64) bool { return v > 0 }

func validateSamples(path string, v *int, bad func(string, string, ...any)) {
	if v != nil && (*v < 1 || *v > MaxRecoverySamples) {
		bad(path, "must be between 1 and %d, got %d", MaxRecoverySamples, *v)
	}
}
