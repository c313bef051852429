package config

import (
	"fmt"
	"path/filepath"
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
	c.Fleet.validate(bad)
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

// maxUnixSocketPath: sun_path holds 108 bytes with the terminating NUL.
const maxUnixSocketPath = 107

// validSocketPath checks the Unix socket path at field: absolute (where says where such a socket
// is, after "must be an absolute path"), clean (example shows one), and short enough for
// sun_path.
func validSocketPath(field, path, example, where string, bad func(path, format string, args ...any)) {
	switch {
	case !filepath.IsAbs(path):
		bad(field, "must be an absolute path%s, got %q", where, path)
	case strings.HasSuffix(path, "/") || filepath.Clean(path) != path:
		bad(field, "must be the socket file's clean path, e.g. %s, got %q", example, path)
	case len(path) > maxUnixSocketPath:
		bad(field, "is %d bytes long; a Unix socket's path may have at most %d", len(path), maxUnixSocketPath)
	}
}
