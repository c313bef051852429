package config

import (
	"fmt"
	"math"
	"time"
)

// FleetConfig configures what the cluster-side breaker controller does about the fleet as a whole.
type FleetConfig struct {
	// SharedCauses judges, continuously, what the cluster's GPU faults have in common (a driver,
	// a model, an NVLink domain, a zone, a topology label, a workload): docs/fleet.md.
	SharedCauses SharedCausesConfig `yaml:"sharedCauses,omitempty" json:"sharedCauses,omitempty"`
	// Records keeps every GPU's life by board serial in GPURecords (fleetrecords.go).
	Records RecordsConfig `yaml:"records,omitempty" json:"records,omitempty"`
	// RepeatOffender is the rule agents apply to their GPUs' records when they start; nil: none.
	RepeatOffender *RepeatOffenderConfig `yaml:"repeatOffender,omitempty" json:"repeatOffender,omitempty"`
}

// SharedCausesConfig is `fleet.sharedCauses`: while it leads, `gpuhealth breaker controller`
// judges the fleet every Every, as `gpuhealth fleet` does on demand, and publishes the verdict
// (a ConfigMap, Events, metrics). The judge's fields left unset take the judge's own defaults
// (internal/fleet/sharedcause: window 1h, minFaultyGPUs 5, minRatio 5, alpha 0.001); this package
// does not repeat them, so that `gpuhealth fleet` and the controller cannot drift apart.
type SharedCausesConfig struct {
	// Enabled turns the continuous judge on (default false).
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Every is the period between two judgements (default 1m, at least 10s).
	Every *Duration `yaml:"every,omitempty" json:"every,omitempty"`
	// Window is how far back a fault counts (default: the judge's, 1h).
	Window *Duration `yaml:"window,omitempty" json:"window,omitempty"`
	// Labels are node labels to group the GPUs by besides driver, model, NVLink domain and zone
	// (a rack, a switch, a node pool), at most MaxSharedCausesLabels.
	Labels []string `yaml:"labels,omitempty" json:"labels,omitempty"`
	// MinFaultyGPUs is the fewest faulty GPUs a group needs to be a finding (default: the
	// judge's, 5; at least 2).
	MinFaultyGPUs *int `yaml:"minFaultyGPUs,omitempty" json:"minFaultyGPUs,omitempty"`
	// MinRatio is how many times the rest's rate a group's rate must be (default: the judge's,
	// 5; at least 1).
	MinRatio *float64 `yaml:"minRatio,omitempty" json:"minRatio,omitempty"`
	// Alpha is the chance of a false finding allowed over one judgement (default: the judge's,
	// 0.001; above 0, at most MaxSharedCausesAlpha).
	Alpha *float64 `yaml:"alpha,omitempty" json:"alpha,omitempty"`
}

// Defaults and limits of SharedCausesConfig's own fields.
const (
	DefaultSharedCausesEvery = time.Minute
	// MinSharedCausesEvery bounds how often the controller reads every Node and judges.
	MinSharedCausesEvery = 10 * time.Second
	// MaxSharedCausesLabels bounds the attributes judged (each a group per value).
	MaxSharedCausesLabels = 16
	// MinSharedCausesFaultyGPUs: one faulty GPU is never a shared cause.
	MinSharedCausesFaultyGPUs = 2
	// MaxSharedCausesAlpha: a false finding in more than every other judgement is no test.
	MaxSharedCausesAlpha = 0.5
)

// IsEnabled reports whether the continuous judge is on.
func (s SharedCausesConfig) IsEnabled() bool { return s.Enabled != nil && *s.Enabled }

// Period is Every, defaulted.
func (s SharedCausesConfig) Period() time.Duration {
	if s.Every == nil {
		return DefaultSharedCausesEvery
	}
	return time.Duration(*s.Every)
}

func (f FleetConfig) validate(bad func(path, format string, args ...any)) {
	f.SharedCauses.validate("fleet.sharedCauses", bad)
	f.Records.validate("fleet.records", bad)
	f.RepeatOffender.validate("fleet.repeatOffender", bad)
}

func (s SharedCausesConfig) validate(path string, bad func(path, format string, args ...any)) {
	if e := s.Every; e != nil && time.Duration(*e) < MinSharedCausesEvery {
		bad(path+".every", "must be at least %v, got %v", MinSharedCausesEvery, time.Duration(*e))
	}
	if w := s.Window; w != nil && time.Duration(*w) <= 0 {
		bad(path+".window", "must be positive, got %v", time.Duration(*w))
	}
	if len(s.Labels) > MaxSharedCausesLabels {
		bad(path+".labels", "at most %d labels, got %d", MaxSharedCausesLabels, len(s.Labels))
	}
	seen := map[string]bool{}
	for i, l := range s.Labels {
		p := fmt.Sprintf("%s.labels[%d]", path, i)
		if err := validLabelKey(l); err != nil {
			bad(p, "%q is not a label key: %v", l, err)
		}
		if seen[l] {
			bad(p, "duplicate label %q", l)
		}
		seen[l] = true
	}
	if n := s.MinFaultyGPUs; n != nil && *n < MinSharedCausesFaultyGPUs {
		bad(path+".minFaultyGPUs", "must be %d or more, got %d", MinSharedCausesFaultyGPUs, *n)
	}
	// Written so that NaN fails too: YAML's .nan is above nothing.
	if r := s.MinRatio; r != nil && !(*r >= 1 && !math.IsInf(*r, 1)) {
		bad(path+".minRatio", "must be a number of 1 or more, got %v", *r)
	}
	if a := s.Alpha; a != nil && !(*a > 0 && *a <= MaxSharedCausesAlpha) {
		bad(path+".alpha", "must be above 0 and at most %v, got %v", MaxSharedCausesAlpha, *a)
	}
}
