package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func TestRepeatRulesFromTheFile(t *testing.T) {
	p := mustPolicy(t, `
repeats:
  disable: [XIDSpreadOverGPUs]
  rootCauseWindow: 90s
  rules:
  - name: RepeatedXID13OnSameGPU
    xids: [13]
    count: 5
    window: 2h
    burst: 30s
    severity: Unhealthy
    clearsOn: gpuReset
    recommendedAction: resetGPU
  - name: RepeatedXID94
    xids: [94, 95]
    count: 2
    window: 24h
  - name: Xid119Spread
    xids: [119]
    gpus: 4
    window: 5m
`)
	byName := map[string]health.RepeatRule{}
	for _, r := range p.Repeats {
		byName[r.Name] = r
	}
	if _, ok := byName[health.ReasonXIDSpreadOverGPU]; ok {
		t.Error("disabled rule still in the policy")
	}
	if r := byName[health.ReasonRepeatedXID13]; r.Count != 5 || r.Window != 2*time.Hour || r.Burst != 30*time.Second ||
		r.Severity != health.Unhealthy || r.ClearsOn != health.ClearsOnGPUReset || r.Action != health.ActionResetGPU {
		t.Errorf("replaced rule %+v", r)
	}
	if r := byName["RepeatedXID94"]; r.Severity != health.Degraded || r.ClearsOn != health.ClearsOnQuietPeriod || r.Action != health.ActionInspect {
		t.Errorf("added rule %+v, want the defaults Degraded/quietPeriod/inspect", r)
	}
	if r := byName["Xid119Spread"]; !r.NodeScoped() || r.GPUs != 4 {
		t.Errorf("spread rule %+v", r)
	}
	if _, ok := byName[health.ReasonRepeatedXID31]; !ok {
		t.Error("a profile rule the file does not name was lost")
	}
	if p.RootCauseWindow != 90*time.Second {
		t.Errorf("rootCauseWindow %v", p.RootCauseWindow)
	}
	// The default policy it came from is untouched.
	if len(health.DefaultPolicy().Repeats) != len(health.DefaultRepeatRules()) {
		t.Error("the file changed the built-in rules")
	}
}

func TestRepeatRuleErrorsHaveFieldPaths(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"repeats:\n  disable: [Nope]\n", "repeats.disable[0]: profile \"default\" has no repeat rule \"Nope\""},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3}\n", "repeats.rules[0].window: required"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 1, window: 1h}\n", "repeats.rules[0]: count: must be from 2"},
		{"repeats:\n  rules:\n  - {name: A, xids: [0], count: 3, window: 1h}\n", "repeats.rules[0].xids[0]"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3, gpus: 3, window: 1h}\n", "not both"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], gpus: 3, window: 1h, severity: Unhealthy}\n", "a spread rule (gpus) raises a node finding"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3, window: 1h, severity: Healthy}\n", "must raise Degraded or Unhealthy"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3, window: 1h}\n  - {name: A, xids: [31], count: 3, window: 1h}\n", "repeats.rules[1].name: duplicate rule \"A\""},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3, window: 1h, burst: 2h}\n", "burst: must be zero or positive and shorter"},
		{"repeats:\n  rootCauseWindow: -1s\n", "repeats.rootCauseWindow: must be positive"},
		{"repeats:\n  rules:\n  - {name: A, xids: [13], count: 3, window: 1h, colour: red}\n", "colour"},
	} {
		_, err := config.Parse([]byte(header + tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tc.body, err, tc.want)
		}
	}
}

func TestEscalationFromTheFile(t *testing.T) {
	p := mustPolicy(t, "escalation: {returns: 3, window: 72h}\n")
	if !p.Escalation.Enabled || p.Escalation.Returns != 3 || p.Escalation.Window != 72*time.Hour {
		t.Errorf("escalation %+v", p.Escalation)
	}
	if p := mustPolicy(t, "escalation: {enabled: false}\n"); p.Escalation.Enabled {
		t.Error("escalation still on")
	}
	if p := mustPolicy(t, "profile: device-plugin\nescalation: {enabled: true}\n"); !p.Escalation.Enabled || p.Escalation.Returns != health.DefaultEscalationReturns {
		t.Errorf("device-plugin profile with escalation on: %+v", p.Escalation)
	}
	for body, want := range map[string]string{
		"escalation: {returns: 0}\n": "escalation.returns: must be from 1",
		"escalation: {window: 0s}\n": "escalation.window: must be positive",
		"escalation: {retruns: 2}\n": "retruns",
	} {
		if _, err := config.Parse([]byte(header + body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", body, err, want)
		}
	}
}

func TestInventorySection(t *testing.T) {
	c := mustParse(t, "inventory: {sysfsRoot: /host/sys, expectedGPUs: 8}\n")
	if !c.Inventory.On() || c.Inventory.SysfsRoot != "/host/sys" || c.Inventory.ExpectedGPUs != 8 {
		t.Errorf("inventory %+v", c.Inventory)
	}
	if c := mustParse(t, "inventory: {enabled: false}\n"); c.Inventory.On() {
		t.Error("inventory still on")
	}
	if _, err := config.Parse([]byte(header + "inventory: {expectedGPUs: -1}\n")); err == nil || !strings.Contains(err.Error(), "inventory.expectedGPUs: must be from 0") {
		t.Errorf("negative expectedGPUs: %v", err)
	}
}
