package config

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

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

func (x XIDConfig) validate(bad func(string, string, ...any)) {
	if x.Unknown != nil {
		validateRule("xids.unknown", *x.Unknown, bad)
	}
	for i, o := range x.Overrides {
		path := fmt.Sprintf("xids.overrides[%d]", i)
		if len(o.XIDs) == 0 {
			bad(path+".xids", "required: list the XIDs this rule applies to")
		}
		for j, id := range o.XIDs {
			if id == 0 || id > MaxXID {
				bad(fmt.Sprintf("%s.xids[%d]", path, j), "must be an XID from 1 to %d, got %d", MaxXID, id)
			}
		}
		if o.Severity == nil && o.ClearsOn == nil && o.Evict == nil && o.RecommendedAction == nil {
			bad(path, "changes nothing: set severity, clearsOn, evict or recommendedAction")
		}
		validateRule(path, o.XIDRule, bad)
	}
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

// apply changes p's rule for unknown XIDs and its rules for the XIDs overridden.
func (x XIDConfig) apply(p *health.Policy) {
	if x.Unknown != nil {
		p.UnknownXID = applyRule(p.UnknownXID, *x.Unknown)
	}
	for _, o := range x.Overrides {
		for _, id := range o.XIDs {
			base, known := p.XIDs[id]
			if !known {
				base = p.UnknownXID
				base.Description = "XID " + strconv.FormatUint(uint64(id), 10) + " (configured)"
			}
			// An override is explicit: it never defers to the recovery action.
			base.FollowRecoveryAction = false
			p.XIDs[id] = applyRule(base, o.XIDRule)
		}
	}
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
