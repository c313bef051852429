// Package config reads the HealthConfig file (apiVersion gpuhealth.dev/v1alpha1) that tunes the
// health policy: the profile to start from, per-XID overrides, which checks run and their
// thresholds. Decoding is strict (an unknown field is an error naming it), unset fields take the
// profile's defaults, and validation errors carry field paths.
package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
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
}

// AgentSection returns the agent section with defaults filled in.
func (c *HealthConfig) AgentSection() AgentConfig { return c.Agent.WithDefaults() }

// XIDConfig changes the XID table.
type XIDConfig struct {
	// Unknown is the rule for XIDs missing from the table (default: Unhealthy until reset).
	Unknown *XIDRule `yaml:"unknown,omitempty" json:"unknown,omitempty"`
	// Overrides replace the table's rule for the XIDs they list; later entries win.
	Overrides []XIDOverride `yaml:"overrides,omitempty" json:"overrides,omitempty"`
}

// XIDRule is a rule in the file. Unset fields keep the rule being overridden.
type XIDRule struct {
	Severity          *string `yaml:"severity,omitempty" json:"severity,omitempty"`
	ClearsOn          *string `yaml:"clearsOn,omitempty" json:"clearsOn,omitempty"`
	Evict             *bool   `yaml:"evict,omitempty" json:"evict,omitempty"`
	RecommendedAction *string `yaml:"recommendedAction,omitempty" json:"recommendedAction,omitempty"`
}

// XIDOverride applies a rule to a list of XIDs.
type XIDOverride struct {
	XIDs    []uint32 `yaml:"xids" json:"xids"`
	XIDRule `yaml:",inline" json:",inline"`
}

// Checks turns polled checks on and off and sets their thresholds.
type Checks struct {
	ECC            *ECCCheck     `yaml:"ecc,omitempty" json:"ecc,omitempty"`
	RowRemap       *Toggle       `yaml:"rowRemap,omitempty" json:"rowRemap,omitempty"`
	RetiredPages   *Toggle       `yaml:"retiredPages,omitempty" json:"retiredPages,omitempty"`
	Thermal        *ThermalCheck `yaml:"thermal,omitempty" json:"thermal,omitempty"`
	ClockEvents    *ClockCheck   `yaml:"clockEvents,omitempty" json:"clockEvents,omitempty"`
	PCIeReplays    *RateCheck    `yaml:"pcieReplays,omitempty" json:"pcieReplays,omitempty"`
	NVLink         *NVLinkCheck  `yaml:"nvlink,omitempty" json:"nvlink,omitempty"`
	RecoveryAction *Toggle       `yaml:"recoveryAction,omitempty" json:"recoveryAction,omitempty"`
	// The fabric and the early warnings (docs/xid-policy.md).
	Fabric            *FabricCheck           `yaml:"fabric,omitempty" json:"fabric,omitempty"`
	RowRemapHistogram *Toggle                `yaml:"rowRemapHistogram,omitempty" json:"rowRemapHistogram,omitempty"`
	SRAM              *Toggle                `yaml:"sram,omitempty" json:"sram,omitempty"`
	PCIeLink          *PCIeLinkCheck         `yaml:"pcieLink,omitempty" json:"pcieLink,omitempty"`
	NVLinkRecoveries  *NVLinkRecoveriesCheck `yaml:"nvlinkRecoveries,omitempty" json:"nvlinkRecoveries,omitempty"`
}

// FabricCheck configures the NVLink fabric checks.
type FabricCheck struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// RegistrationTimeout is how long a registration may stay incomplete before the GPU is
	// Degraded (default 10m).
	RegistrationTimeout *Duration `yaml:"registrationTimeout,omitempty" json:"registrationTimeout,omitempty"`
}

// PCIeLinkCheck configures the PCIe link check.
type PCIeLinkCheck struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Generation also judges the link's generation (off: idle GPUs train down to save power).
	Generation      *bool `yaml:"generation,omitempty" json:"generation,omitempty"`
	RecoverySamples *int  `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// NVLinkRecoveriesCheck configures the NVLink recovery-count check.
type NVLinkRecoveriesCheck struct {
	Enabled *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	PerHour *float64 `yaml:"perHour,omitempty" json:"perHour,omitempty"`
}

// Toggle is a check with no settings beyond on and off.
type Toggle struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
}

// ECCCheck configures the ECC checks.
type ECCCheck struct {
	Enabled                 *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	CorrectedStormPerMinute *float64 `yaml:"correctedStormPerMinute,omitempty" json:"correctedStormPerMinute,omitempty"`
}

// ThermalCheck configures the temperature check. Zero thresholds mean "the device's own".
type ThermalCheck struct {
	Enabled         *bool  `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	SlowdownC       *int64 `yaml:"slowdownC,omitempty" json:"slowdownC,omitempty"`
	ShutdownC       *int64 `yaml:"shutdownC,omitempty" json:"shutdownC,omitempty"`
	RecoverySamples *int   `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// ClockCheck configures the clock-event (throttle) check.
type ClockCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	Reasons         []string `yaml:"reasons,omitempty" json:"reasons,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// RateCheck configures a counter-rate check.
type RateCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	PerMinute       *float64 `yaml:"perMinute,omitempty" json:"perMinute,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// NVLinkCheck configures the NVLink checks.
type NVLinkCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	ErrorsPerMinute *float64 `yaml:"errorsPerMinute,omitempty" json:"errorsPerMinute,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
	// ExpectedLinks is how many NVLinks each GPU should have up (0: what the GPU reports
	// active when first read). With it, a link that never came up is Unhealthy (NVLinkDown).
	ExpectedLinks *int `yaml:"expectedLinks,omitempty" json:"expectedLinks,omitempty"`
}

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

// Default returns the configuration that selects the default profile and changes nothing.
func Default() *HealthConfig {
	return &HealthConfig{APIVersion: APIVersion, Kind: Kind, Profile: "default"}
}

// Load reads, decodes and validates a HealthConfig file. Errors name the file.
func Load(path string) (*HealthConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadPolicy reads the HealthConfig file at path (the default configuration when path is empty)
// and builds its Policy: what every embedder does at start. Errors name the file.
func LoadPolicy(path string) (*HealthConfig, *health.Policy, error) {
	cfg := Default()
	if path != "" {
		var err error
		if cfg, err = Load(path); err != nil {
			return nil, nil, err
		}
	}
	policy, err := cfg.Policy()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, policy, nil
}

// Parse decodes and validates a HealthConfig.
func Parse(data []byte) (*HealthConfig, error) {
	var c HealthConfig
	if err := strictyaml.Decode(data, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

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
	if c.XIDs.Unknown != nil {
		validateRule("xids.unknown", *c.XIDs.Unknown, bad)
	}
	for i, o := range c.XIDs.Overrides {
		path := fmt.Sprintf("xids.overrides[%d]", i)
		if len(o.XIDs) == 0 {
			bad(path+".xids", "required: list the XIDs this rule applies to")
		}
		for j, x := range o.XIDs {
			if x == 0 || x > MaxXID {
				bad(fmt.Sprintf("%s.xids[%d]", path, j), "must be an XID from 1 to %d, got %d", MaxXID, x)
			}
		}
		if o.Severity == nil && o.ClearsOn == nil && o.Evict == nil && o.RecommendedAction == nil {
			bad(path, "changes nothing: set severity, clearsOn, evict or recommendedAction")
		}
		validateRule(path, o.XIDRule, bad)
	}
	ch := c.Checks
	if ch.ECC != nil && ch.ECC.CorrectedStormPerMinute != nil && !positive(*ch.ECC.CorrectedStormPerMinute) {
		bad("checks.ecc.correctedStormPerMinute", "must be positive, got %v", *ch.ECC.CorrectedStormPerMinute)
	}
	if t := ch.Thermal; t != nil {
		if t.SlowdownC != nil && (*t.SlowdownC < 0 || *t.SlowdownC > 150) {
			bad("checks.thermal.slowdownC", "must be 0 (the device's own) or a temperature up to 150, got %d", *t.SlowdownC)
		}
		if t.ShutdownC != nil && (*t.ShutdownC < 0 || *t.ShutdownC > 150) {
			bad("checks.thermal.shutdownC", "must be 0 (the device's own) or a temperature up to 150, got %d", *t.ShutdownC)
		}
		if t.SlowdownC != nil && t.ShutdownC != nil && *t.SlowdownC > 0 && *t.ShutdownC > 0 && *t.SlowdownC >= *t.ShutdownC {
			bad("checks.thermal.shutdownC", "must be above slowdownC (%d), got %d", *t.SlowdownC, *t.ShutdownC)
		}
		validateSamples("checks.thermal.recoverySamples", t.RecoverySamples, bad)
	}
	if k := ch.ClockEvents; k != nil {
		for i, r := range k.Reasons {
			if _, err := health.ParseClockEventReason(r); err != nil {
				bad(fmt.Sprintf("checks.clockEvents.reasons[%d]", i), "%v", err)
			}
		}
		validateSamples("checks.clockEvents.recoverySamples", k.RecoverySamples, bad)
	}
	if r := ch.PCIeReplays; r != nil {
		if r.PerMinute != nil && !positive(*r.PerMinute) {
			bad("checks.pcieReplays.perMinute", "must be positive, got %v", *r.PerMinute)
		}
		validateSamples("checks.pcieReplays.recoverySamples", r.RecoverySamples, bad)
	}
	if n := ch.NVLink; n != nil {
		if n.ErrorsPerMinute != nil && !positive(*n.ErrorsPerMinute) {
			bad("checks.nvlink.errorsPerMinute", "must be positive, got %v", *n.ErrorsPerMinute)
		}
		validateSamples("checks.nvlink.recoverySamples", n.RecoverySamples, bad)
		if n.ExpectedLinks != nil && (*n.ExpectedLinks < 0 || *n.ExpectedLinks > MaxNVLinks) {
			bad("checks.nvlink.expectedLinks", "must be from 0 to %d, got %d", MaxNVLinks, *n.ExpectedLinks)
		}
	}
	if f := ch.Fabric; f != nil && f.RegistrationTimeout != nil && time.Duration(*f.RegistrationTimeout) <= 0 {
		bad("checks.fabric.registrationTimeout", "must be positive, got %v", time.Duration(*f.RegistrationTimeout))
	}
	if l := ch.PCIeLink; l != nil {
		validateSamples("checks.pcieLink.recoverySamples", l.RecoverySamples, bad)
	}
	if r := ch.NVLinkRecoveries; r != nil && r.PerHour != nil && !positive(*r.PerHour) {
		bad("checks.nvlinkRecoveries.perHour", "must be positive, got %v", *r.PerHour)
	}
	c.Repeats.validate(c.Profile, bad)
	if e := c.Escalation; e != nil {
		if e.Returns != nil && (*e.Returns < 1 || *e.Returns > health.MaxHistory/2) {
			bad("escalation.returns", "must be from 1 to %d (the history keeps %d entries), got %d", health.MaxHistory/2, health.MaxHistory, *e.Returns)
		}
		if e.Window != nil && time.Duration(*e.Window) <= 0 {
			bad("escalation.window", "must be positive, got %v", time.Duration(*e.Window))
		}
	}
	c.Inventory.validate(bad)
	c.Agent.validate(bad)
	c.KernelLog.validate(bad)
	c.Remediation.validate(c.Agent.NoExecute, bad)
	if len(errs) == 0 {
		return nil
	}
	return errs
}

func validateRule(path string, r XIDRule, bad func(string, string, ...any)) {
	if r.Severity != nil {
		if _, err := health.ParseSeverity(*r.Severity); err != nil {
			bad(path+".severity", "%v", err)
		}
	}
	if r.ClearsOn != nil {
		if _, err := health.ParseClearsOn(*r.ClearsOn); err != nil {
			bad(path+".clearsOn", "%v", err)
		}
	}
	if r.RecommendedAction != nil && strings.TrimSpace(*r.RecommendedAction) == "" {
		bad(path+".recommendedAction", "must not be empty")
	}
}

// positive reports whether v is a usable rate limit: above zero and not NaN (YAML's .nan, which
// no rate is ever above, would turn the check off without saying so).
func positive(v float64) bool { return v > 0 }

func validateSamples(path string, v *int, bad func(string, string, ...any)) {
	if v != nil && (*v < 1 || *v > MaxRecoverySamples) {
		bad(path, "must be between 1 and %d, got %d", MaxRecoverySamples, *v)
	}
}

// SampleEvery returns the sampling period, defaulted.
func (c *HealthConfig) SampleEvery() time.Duration {
	if c.SampleInterval == nil {
		return DefaultSampleEvery
	}
	return time.Duration(*c.SampleInterval)
}

// Policy builds the health policy: the profile's, with the file's changes applied. Call it on
// a validated config.
func (c *HealthConfig) Policy() (*health.Policy, error) {
	p, err := health.PolicyForProfile(c.Profile)
	if err != nil {
		return nil, err
	}
	if c.QuietPeriod != nil {
		p.QuietPeriod = time.Duration(*c.QuietPeriod)
	}
	if c.XIDs.Unknown != nil {
		p.UnknownXID = applyRule(p.UnknownXID, *c.XIDs.Unknown)
	}
	for _, o := range c.XIDs.Overrides {
		for _, x := range o.XIDs {
			base, known := p.XIDs[x]
			if !known {
				base = p.UnknownXID
				base.Description = "XID " + strconv.FormatUint(uint64(x), 10) + " (configured)"
			}
			// An override is explicit: it never defers to the recovery action.
			base.FollowRecoveryAction = false
			p.XIDs[x] = applyRule(base, o.XIDRule)
		}
	}
	if err := c.Repeats.apply(p); err != nil {
		return nil, err
	}
	if e := c.Escalation; e != nil {
		setBool(&p.Escalation.Enabled, e.Enabled)
		setInt(&p.Escalation.Returns, e.Returns)
		if e.Window != nil {
			p.Escalation.Window = time.Duration(*e.Window)
		}
	}
	ch := c.Checks
	if e := ch.ECC; e != nil {
		setBool(&p.ECC.Enabled, e.Enabled)
		if e.CorrectedStormPerMinute != nil {
			p.ECC.CorrectedStormPerMinute = *e.CorrectedStormPerMinute
		}
	}
	if t := ch.RowRemap; t != nil {
		setBool(&p.RowRemap.Enabled, t.Enabled)
	}
	if t := ch.RetiredPages; t != nil {
		setBool(&p.RetiredPages.Enabled, t.Enabled)
	}
	if t := ch.RecoveryAction; t != nil {
		setBool(&p.RecoveryAction.Enabled, t.Enabled)
	}
	if t := ch.Thermal; t != nil {
		setBool(&p.Thermal.Enabled, t.Enabled)
		setInt(&p.Thermal.RecoverySamples, t.RecoverySamples)
		if t.SlowdownC != nil {
			p.Thermal.SlowdownC = *t.SlowdownC
		}
		if t.ShutdownC != nil {
			p.Thermal.ShutdownC = *t.ShutdownC
		}
	}
	if k := ch.ClockEvents; k != nil {
		setBool(&p.ClockEvents.Enabled, k.Enabled)
		setInt(&p.ClockEvents.RecoverySamples, k.RecoverySamples)
		if k.Reasons != nil {
			p.ClockEvents.Reasons = 0
			for _, r := range k.Reasons {
				bit, err := health.ParseClockEventReason(r)
				if err != nil {
					return nil, err
				}
				p.ClockEvents.Reasons |= bit
			}
		}
	}
	if r := ch.PCIeReplays; r != nil {
		setBool(&p.PCIeReplays.Enabled, r.Enabled)
		setInt(&p.PCIeReplays.RecoverySamples, r.RecoverySamples)
		if r.PerMinute != nil {
			p.PCIeReplays.PerMinute = *r.PerMinute
		}
	}
	if n := ch.NVLink; n != nil {
		setBool(&p.NVLink.Enabled, n.Enabled)
		setInt(&p.NVLink.RecoverySamples, n.RecoverySamples)
		if n.ErrorsPerMinute != nil {
			p.NVLink.ErrorsPerMinute = *n.ErrorsPerMinute
		}
	}
	if f := ch.Fabric; f != nil {
		setBool(&p.Fabric.Enabled, f.Enabled)
		if f.RegistrationTimeout != nil {
			p.Fabric.RegistrationTimeout = time.Duration(*f.RegistrationTimeout)
		}
	}
	if t := ch.RowRemapHistogram; t != nil {
		setBool(&p.RowRemapHistogram.Enabled, t.Enabled)
	}
	if t := ch.SRAM; t != nil {
		setBool(&p.SRAM.Enabled, t.Enabled)
	}
	if l := ch.PCIeLink; l != nil {
		setBool(&p.PCIeLink.Enabled, l.Enabled)
		setBool(&p.PCIeLink.Generation, l.Generation)
		setInt(&p.PCIeLink.RecoverySamples, l.RecoverySamples)
	}
	if r := ch.NVLinkRecoveries; r != nil {
		setBool(&p.NVLinkRecoveries.Enabled, r.Enabled)
		if r.PerHour != nil {
			p.NVLinkRecoveries.PerHour = *r.PerHour
		}
	}
	return p, nil
}

// ExpectedNVLinks is checks.nvlink.expectedLinks, or 0 when unset.
func (c *HealthConfig) ExpectedNVLinks() int {
	if c.Checks.NVLink == nil || c.Checks.NVLink.ExpectedLinks == nil {
		return 0
	}
	return *c.Checks.NVLink.ExpectedLinks
}

func applyRule(base health.XIDRule, r XIDRule) health.XIDRule {
	if r.Severity != nil {
		base.Severity, _ = health.ParseSeverity(*r.Severity)
	}
	if r.ClearsOn != nil {
		base.ClearsOn, _ = health.ParseClearsOn(*r.ClearsOn)
	}
	if r.Evict != nil {
		base.Evict = *r.Evict
	}
	if r.RecommendedAction != nil {
		base.Action = health.Action(*r.RecommendedAction)
	}
	return base
}

func setBool(dst *bool, v *bool) {
	if v != nil {
		*dst = *v
	}
}

func setInt(dst *int, v *int) {
	if v != nil {
		*dst = *v
	}
}
