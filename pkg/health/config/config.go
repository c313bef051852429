// Package config reads the HealthConfig file (apiVersion gpuhealth.dev/v1alpha1) that tunes the
// health policy: the profile to start from, per-XID overrides, which checks run and their
// thresholds. Decoding is strict (an unknown field is an error naming it), unset fields take the
// profile's defaults, and validation errors carry field paths.
package config

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/strictyaml"
)

// File identity.
const (
	APIVersion = "gpuhealth.dev/v1alpha1"
	Kind       = "HealthConfig"
)

// Limits on values.
const (
	MaxXID             = 1 << 20
	MaxRecoverySamples = 1000
	MinSampleInterval  = 100 * time.Millisecond
	// MaxNVLinks bounds checks.nvlink.expectedLinks (NVML_NVLINK_MAX_LINKS is 18 today).
	MaxNVLinks         = 64
	DefaultSampleEvery = 10 * time.Second
)

// HealthConfig is the configuration file. Pointer fields are optional; nil means "the
// profile's default".
type HealthConfig struct {
	APIVersion string `yaml:"apiVersion" json:"apiVersion"`
	Kind       string `yaml:"kind" json:"kind"`
	// Profile is the built-in policy to start from: default or device-plugin.
	Profile string `yaml:"profile,omitempty" json:"profile,omitempty"`
	// SampleInterval is the period of polled readings (default 10s).
	SampleInterval *Duration `yaml:"sampleInterval,omitempty" json:"sampleInterval,omitempty"`
	// QuietPeriod ends conditions that clear on a quiet period (default 10m).
	QuietPeriod *Duration `yaml:"quietPeriod,omitempty" json:"quietPeriod,omitempty"`
	XIDs        XIDConfig `yaml:"xids,omitempty" json:"xids,omitempty"`
	// Repeats changes the repeat rules: XIDs judged by how often they come back.
	Repeats RepeatsConfig `yaml:"repeats,omitempty" json:"repeats,omitempty"`
	// Escalation turns a GPU whose faults keep returning after repairs into one to replace.
	Escalation *EscalationConfig `yaml:"escalation,omitempty" json:"escalation,omitempty"`
	Checks     Checks            `yaml:"checks,omitempty" json:"checks,omitempty"`
	// Inventory compares the GPUs the backend opens with those the node should have.
	Inventory InventoryConfig `yaml:"inventory,omitempty" json:"inventory,omitempty"`
	// Agent configures `gpuhealth agent`; other commands ignore it.
	Agent AgentConfig `yaml:"agent,omitempty" json:"agent,omitempty"`
	// KernelLog configures the kernel log as a second source of signals (agent, device plugin).
	KernelLog KernelLogConfig `yaml:"kernelLog,omitempty" json:"kernelLog,omitempty"`
	// Remediation resets sick GPUs automatically (off by default); see RemediationConfig.
	Remediation RemediationConfig `yaml:"remediation,omitempty" json:"remediation,omitempty"`
	// Fleet configures what gpuhealth does about the fleet as a whole (the breaker controller's
	// judge of shared causes, fleet.sharedCauses).
	Fleet FleetConfig `yaml:"fleet,omitempty" json:"fleet,omitempty"`
}

// AgentSection returns the agent section with defaults filled in.
func (c *HealthConfig) AgentSection() AgentConfig { return c.Agent.WithDefaults() }

// Duration is a Go duration string in the file ("10s"); a bare number is an error. It is an
// encoding.TextUnmarshaler, so it reads the same from YAML, JSON and flags.
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := strictyaml.ParseDuration(string(text))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// String is the Go duration string.
func (d Duration) String() string { return time.Duration(d).String() }

// SampleEvery returns the sampling period, defaulted.
func (c *HealthConfig) SampleEvery() time.Duration {
	if c.SampleInterval == nil {
		return DefaultSampleEvery
	}
	return time.Duration(*c.SampleInterval)
}

// ExpectedNVLinks is checks.nvlink.expectedLinks, or 0 when unset.
func (c *HealthConfig) ExpectedNVLinks() int {
	if c.Checks.NVLink == nil || c.Checks.NVLink.ExpectedLinks == nil {
		return 0
	}
	return *c.Checks.NVLink.ExpectedLinks
}
