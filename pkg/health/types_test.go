package health_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestSeverityText(t *testing.T) {
	for _, s := range []health.Severity{health.Healthy, health.Degraded, health.Unhealthy} {
		t.Run(s.String(), func(t *testing.T) {
			b, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back health.Severity
			if err := json.Unmarshal(b, &back); err != nil || back != s {
				t.Fatalf("round trip of %s through %s: %v, %v", s, b, back, err)
			}
		})
	}
	if health.Healthy >= health.Degraded || health.Degraded >= health.Unhealthy {
		t.Fatal("severities are not ordered")
	}
	if _, err := health.ParseSeverity("unhealthy"); err == nil {
		t.Fatal("ParseSeverity is case-insensitive; the file format is not")
	}
	if _, err := json.Marshal(health.Severity(9)); err == nil {
		t.Fatal("an invalid severity marshalled")
	}
	if got := health.Severity(9).String(); got != "Severity(9)" {
		t.Fatalf("String() = %q", got)
	}
}

func TestClearsOnText(t *testing.T) {
	want := map[health.ClearsOn]bool{ // value -> cleared by a reboot
		health.ClearsOnGPUReset: true, health.ClearsOnNodeReboot: true, health.ClearsOnRecovered: true,
		health.ClearsOnQuietPeriod: true, health.ClearsOnAdmin: false,
	}
	names := []string{"gpuReset", "nodeReboot", "recovered", "quietPeriod", "admin"}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			c, err := health.ParseClearsOn(name)
			if err != nil || c.String() != name {
				t.Fatalf("ParseClearsOn(%q) = %v, %v", name, c, err)
			}
			b, _ := c.MarshalText()
			var back health.ClearsOn
			if err := back.UnmarshalText(b); err != nil || back != c {
				t.Fatalf("round trip: %v, %v", back, err)
			}
			if c.ClearedByReboot() != want[c] {
				t.Fatalf("ClearedByReboot() = %v", c.ClearedByReboot())
			}
		})
	}
	if _, err := health.ParseClearsOn("never"); err == nil {
		t.Fatal("unknown clearsOn accepted")
	}
	if _, err := health.ClearsOn(42).MarshalText(); err == nil {
		t.Fatal("invalid clearsOn marshalled")
	}
}

func TestClockEventReasonNames(t *testing.T) {
	cases := map[string]health.ClockEventReasons{
		"hwSlowdown": health.ClockEventHWSlowdown, "hwThermalSlowdown": health.ClockEventHWThermalSlowdown,
		"hwPowerBrake": health.ClockEventHWPowerBrake, "swThermalSlowdown": health.ClockEventSWThermalSlowdown,
	}
	for name, bit := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := health.ParseClockEventReason(name)
			if err != nil || got != bit || got.String() != name {
				t.Fatalf("ParseClockEventReason(%q) = %v (%s), %v", name, got, got, err)
			}
		})
	}
	if _, err := health.ParseClockEventReason("HWSlowdown"); err == nil {
		t.Fatal("wrong case accepted")
	}
	if got := (health.ClockEventHWSlowdown | health.ClockEventHWPowerBrake | 0x1).String(); got != "hwSlowdown,hwPowerBrake,0x1" {
		t.Fatalf("String() = %q", got)
	}
}

func TestRecoveryActionNames(t *testing.T) {
	for _, name := range []string{"none", "gpuReset", "nodeReboot", "drainP2P", "drainAndReset", "recoverIMEXDomain", "busReset", "systemReboot"} {
		a, err := health.ParseRecoveryAction(name)
		if err != nil || a.String() != name {
			t.Errorf("ParseRecoveryAction(%q) = %v, %v", name, a, err)
		}
	}
	// NVML's numbering, which the NVML backend passes through.
	if health.RecoveryNone != 0 || health.RecoveryGPUReset != 1 || health.RecoveryNodeReboot != 2 ||
		health.RecoveryDrainP2P != 3 || health.RecoveryDrainAndReset != 4 || health.RecoveryRecoverIMEXDomain != 5 ||
		health.RecoveryBusReset != 6 || health.RecoverySystemReboot != 7 {
		t.Fatal("recovery actions do not match NVML's values")
	}
	if _, err := health.ParseRecoveryAction("GPU_RESET"); err == nil {
		t.Fatal("NVML's constant name accepted; the file format uses camelCase")
	}
	_, err := health.ParseRecoveryAction("reboot")
	if err == nil || !strings.Contains(err.Error(), "drainAndReset, recoverIMEXDomain, busReset or systemReboot") {
		t.Fatalf("error %v does not list the names", err)
	}
	if got := health.RecoveryAction(8).String(); got != "RecoveryAction(8)" {
		t.Fatalf("unknown action: %q", got)
	}
}

func TestSignalKindNames(t *testing.T) {
	seen := map[string]bool{}
	for k := health.SignalXID; k <= health.SignalResetRequired; k++ {
		name := k.String()
		if name == "" || strings.HasPrefix(name, "SignalKind(") || seen[name] {
			t.Errorf("kind %d has name %q", k, name)
		}
		seen[name] = true
	}
	if got := health.SignalKind(0).String(); got != "SignalKind(0)" {
		t.Errorf("zero kind: %q", got)
	}
}
