package config

import (
	"fmt"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// RepeatsConfig changes the profile's repeat rules (health.RepeatRule): a rule named like one
// of the profile's replaces it, any other is added, and Disable removes rules by name.
type RepeatsConfig struct {
	// Disable lists the names of profile rules to drop.
	Disable []string `yaml:"disable,omitempty" json:"disable,omitempty"`
	// Rules are added, or replace the profile's rule of the same name.
	Rules []RepeatRule `yaml:"rules,omitempty" json:"rules,omitempty"`
	// RootCauseWindow is how recent another GPU's own fault must be for an XID that an earlier
	// XID caused to be attributed to it (default 5m).
	RootCauseWindow *Duration `yaml:"rootCauseWindow,omitempty" json:"rootCauseWindow,omitempty"`
}

// RepeatRule is a repeat rule in the file: set count (the XIDs repeat on one GPU) or gpus (they
// spread over that many GPUs of the node).
type RepeatRule struct {
	Name        string    `yaml:"name" json:"name"`
	XIDs        []uint32  `yaml:"xids" json:"xids"`
	Count       int       `yaml:"count,omitempty" json:"count,omitempty"`
	GPUs        int       `yaml:"gpus,omitempty" json:"gpus,omitempty"`
	Window      *Duration `yaml:"window" json:"window"`
	Burst       *Duration `yaml:"burst,omitempty" json:"burst,omitempty"`
	Description string    `yaml:"description,omitempty" json:"description,omitempty"`
	// Severity (default Degraded), clearsOn (default quietPeriod), evict and
	// recommendedAction (default inspect) make the condition of a same-GPU rule; a spread rule
	// takes none of them.
	XIDRule `yaml:",inline" json:",inline"`
}

func (r RepeatRule) rule() health.RepeatRule {
	out := health.RepeatRule{
		Name: r.Name, XIDs: slices.Clone(r.XIDs), Count: r.Count, GPUs: r.GPUs,
		Description: r.Description, Source: "HealthConfig",
	}
	if r.Window != nil {
		out.Window = time.Duration(*r.Window)
	}
	if r.Burst != nil {
		out.Burst = time.Duration(*r.Burst)
	}
	if out.Description == "" {
		out.Description = "configured repeat rule " + r.Name
	}
	if !out.NodeScoped() {
		base := applyRule(health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnQuietPeriod, Action: health.ActionInspect}, r.XIDRule)
		out.Severity, out.ClearsOn, out.Evict, out.Action = base.Severity, base.ClearsOn, base.Evict, base.Action
	}
	return out
}

func (c *RepeatsConfig) validate(profile string, bad func(string, string, ...any)) {
	p, err := health.PolicyForProfile(profile)
	if err != nil {
		return // reported for the profile
	}
	known := map[string]bool{}
	for _, r := range p.Repeats {
		known[r.Name] = true
	}
	for i, name := range c.Disable {
		if !known[name] {
			bad(fmt.Sprintf("repeats.disable[%d]", i), "profile %q has no repeat rule %q (it has %v)", p.Name, name, ruleNames(p.Repeats))
		}
	}
	seen := map[string]bool{}
	for i, r := range c.Rules {
		path := fmt.Sprintf("repeats.rules[%d]", i)
		if seen[r.Name] {
			bad(path+".name", "duplicate rule %q", r.Name)
		}
		seen[r.Name] = true
		for j, x := range r.XIDs {
			if x == 0 || x > MaxXID {
				bad(fmt.Sprintf("%s.xids[%d]", path, j), "must be an XID from 1 to %d, got %d", MaxXID, x)
			}
		}
		if r.Window == nil {
			bad(path+".window", "required: the span the repeats must fall in")
		}
		if r.GPUs > 0 && (r.Severity != nil || r.ClearsOn != nil || r.Evict != nil || r.RecommendedAction != nil) {
			bad(path, "a spread rule (gpus) raises a node finding and takes no severity, clearsOn, evict or recommendedAction")
		}
		validateRule(path, r.XIDRule, bad)
		if r.Window != nil {
			rule := r.rule()
			if err := rule.Validate(); err != nil {
				bad(path, "%v", err)
			}
		}
	}
	if c.RootCauseWindow != nil && time.Duration(*c.RootCauseWindow) <= 0 {
		bad("repeats.rootCauseWindow", "must be positive, got %v", time.Duration(*c.RootCauseWindow))
	}
	if n := len(p.Repeats) - len(c.Disable) + len(c.Rules); n > health.MaxRepeatRules {
		bad("repeats.rules", "at most %d rules in all, got %d", health.MaxRepeatRules, n)
	}
}

// apply changes p's repeat rules; call it on a validated config.
func (c *RepeatsConfig) apply(p *health.Policy) error {
	p.Repeats = slices.DeleteFunc(p.Repeats, func(r health.RepeatRule) bool { return slices.Contains(c.Disable, r.Name) })
	for _, fr := range c.Rules {
		r := fr.rule()
		if err := r.Validate(); err != nil {
			return fmt.Errorf("repeat rule %q: %w", r.Name, err)
		}
		if i := slices.IndexFunc(p.Repeats, func(e health.RepeatRule) bool { return e.Name == r.Name }); i >= 0 {
			p.Repeats[i] = r
		} else {
			p.Repeats = append(p.Repeats, r)
		}
	}
	if c.RootCauseWindow != nil {
		p.RootCauseWindow = time.Duration(*c.RootCauseWindow)
	}
	return nil
}

func ruleNames(rules []health.RepeatRule) []string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	return names
}

// EscalationConfig configures escalation to replacing a GPU (health.EscalationPolicy): a GPU
// whose faults returned within window of a repair (a reset or a reboot) returns times is
// Unhealthy with reason FaultReturnsAfterRepair until an administrator clears it.
type EscalationConfig struct {
	Enabled *bool     `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	Returns *int      `yaml:"returns,omitempty" json:"returns,omitempty"`
	Window  *Duration `yaml:"window,omitempty" json:"window,omitempty"`
}

func (e *EscalationConfig) validate(bad func(string, string, ...any)) {
	if e.Returns != nil && (*e.Returns < 1 || *e.Returns > health.MaxHistory/2) {
		bad("escalation.returns", "must be from 1 to %d (the history keeps %d entries), got %d", health.MaxHistory/2, health.MaxHistory, *e.Returns)
	}
	if e.Window != nil && time.Duration(*e.Window) <= 0 {
		bad("escalation.window", "must be positive, got %v", time.Duration(*e.Window))
	}
}

// apply changes p's escalation policy.
func (e *EscalationConfig) apply(p *health.Policy) {
	setBool(&p.Escalation.Enabled, e.Enabled)
	setInt(&p.Escalation.Returns, e.Returns)
	if e.Window != nil {
		p.Escalation.Window = time.Duration(*e.Window)
	}
}
