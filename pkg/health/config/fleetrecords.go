package config

import "time"

// RecordsConfig is `fleet.records`: the breaker controller keeps every GPU's life by board
// serial in GPURecords (package gpurecord; docs/fleet.md "A GPU's life, by serial").
type RecordsConfig struct {
	// Enabled turns the records on in the controller (default false; the chart turns it on and
	// installs the CRD).
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// MaxRecords bounds the records the controller creates (default 500,000).
	MaxRecords *int `yaml:"maxRecords,omitempty" json:"maxRecords,omitempty"`
}

// IsEnabled reports whether the controller keeps records.
func (r RecordsConfig) IsEnabled() bool { return r.Enabled != nil && *r.Enabled }

// RepeatOffenderConfig is `fleet.repeatOffender`: the rule an agent applies, when it starts, to
// the GPURecord of each of its GPUs' serials. A GPU that had Faults faults within Within, on any
// nodes, or (ReplaceGPU) was escalated to ReplaceGPU, is marked Degraded / RepeatOffender. Absent:
// agents read no records.
type RepeatOffenderConfig struct {
	// Faults is how many faults within Within make a repeat offender (0: faults alone never do).
	Faults int `yaml:"faults,omitempty" json:"faults,omitempty"`
	// Within is the window Faults are counted in (required with Faults).
	Within *Duration `yaml:"within,omitempty" json:"within,omitempty"`
	// ReplaceGPU makes a GPU that was ever escalated to ReplaceGPU a repeat offender.
	ReplaceGPU bool `yaml:"replaceGPU,omitempty" json:"replaceGPU,omitempty"`
}

// Limits of RepeatOffenderConfig: a record keeps 64 events, so more faults can never be counted.
const (
	MaxRepeatOffenderFaults = 64
	MaxRepeatOffenderWithin = 5 * 365 * 24 * time.Hour
)

// Window is Within, or 0 when unset.
func (r *RepeatOffenderConfig) Window() time.Duration {
	if r == nil || r.Within == nil {
		return 0
	}
	return time.Duration(*r.Within)
}

func (r RecordsConfig) validate(path string, bad func(path, format string, args ...any)) {
	if m := r.MaxRecords; m != nil && *m < 1 {
		bad(path+".maxRecords", "must be 1 or more, got %d", *m)
	}
}

func (r *RepeatOffenderConfig) validate(path string, bad func(path, format string, args ...any)) {
	if r == nil {
		return
	}
	switch {
	case r.Faults < 0 || r.Faults > MaxRepeatOffenderFaults:
		bad(path+".faults", "must be from 0 to %d (a record keeps %d events), got %d", MaxRepeatOffenderFaults, MaxRepeatOffenderFaults, r.Faults)
	case r.Faults > 0 && r.Within == nil:
		bad(path+".within", "is required with faults: how long the faults are counted")
	case r.Faults == 0 && !r.ReplaceGPU:
		bad(path, "finds nothing: set faults and within, or replaceGPU")
	}
	if w := r.Window(); r.Within != nil && (w <= 0 || w > MaxRepeatOffenderWithin) {
		bad(path+".within", "must be positive and at most %v, got %v", MaxRepeatOffenderWithin, w)
	}
}
