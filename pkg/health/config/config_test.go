package config_test

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

const header = "apiVersion: gpuhealth.dev/v1alpha1\nkind: HealthConfig\n"

func mustParse(t *testing.T, body string) *config.HealthConfig {
	t.Helper()
	c, err := config.Parse([]byte(header + body))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, body)
	}
	return c
}

func mustPolicy(t *testing.T, body string) *health.Policy {
	t.Helper()
	p, err := mustParse(t, body).Policy()
	if err != nil {
		t.Fatalf("Policy: %v", err)
	}
	return p
}

func TestDefaulting(t *testing.T) {
	cases := []struct {
		name string
		body string
		want *health.Policy
	}{
		{"nothing but the header is the default profile", "", health.DefaultPolicy()},
		{"empty profile is the default profile", "profile: \"\"\n", health.DefaultPolicy()},
		{"explicit default profile", "profile: default\n", health.DefaultPolicy()},
		{"empty sections", "xids: {}\nchecks: {}\n", health.DefaultPolicy()},
		{"empty checks", "checks: {ecc: {}, thermal: {}, nvlink: {}, pcieReplays: {}, clockEvents: {}, rowRemap: {}, retiredPages: {}, recoveryAction: {}}\n", health.DefaultPolicy()},
		{"device-plugin profile", "profile: device-plugin\n", health.DevicePluginPolicy()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.body)
			if got := c.SampleEvery(); got != config.DefaultSampleEvery {
				t.Fatalf("SampleEvery() = %v, want %v", got, config.DefaultSampleEvery)
			}
			got, err := c.Policy()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("policy\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
	t.Run("Default()", func(t *testing.T) {
		c := config.Default()
		if err := c.Validate(); err != nil {
			t.Fatalf("Default() does not validate: %v", err)
		}
		p, err := c.Policy()
		if err != nil || !reflect.DeepEqual(p, health.DefaultPolicy()) {
			t.Fatalf("Default().Policy() = %+v, %v", p, err)
		}
	})
}

func TestTheExampleFileParses(t *testing.T) {
	c, err := config.Load(filepath.Join("..", "..", "..", "examples", "healthconfig.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Policy()
	if err != nil {
		t.Fatal(err)
	}
	want := health.DefaultPolicy()
	r109 := want.XIDs[109]
	r109.Severity = health.Healthy
	want.XIDs[109] = r109
	r95 := want.XIDs[95]
	r95.Evict = true
	want.XIDs[95] = r95
	want.Repeats = append(want.Repeats,
		health.RepeatRule{Name: "RepeatedXID94OnSameGPU", XIDs: []uint32{94}, Count: 3, Window: 24 * time.Hour, Burst: time.Minute,
			Severity: health.Degraded, ClearsOn: health.ClearsOnQuietPeriod, Action: health.ActionInspect,
			Description: "contained ECC errors keep returning on this GPU", Source: "HealthConfig"},
		health.RepeatRule{Name: "XID119SpreadOverGPUs", XIDs: []uint32{119}, GPUs: 2, Window: 5 * time.Minute, Burst: 10 * time.Second,
			Description: "configured repeat rule XID119SpreadOverGPUs", Source: "HealthConfig"})
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("example policy\n%+v\nwant the default with XID 109 ignored, XID 95 evicting and two repeat rules added\n%+v", p, want)
	}
}

func TestStrictDecoding(t *testing.T) {
	cases := []struct {
		name string
		data string
		want []string // substrings of the one-line error
	}{
		{"empty file", "", []string{"empty"}},
		{"only a comment", "# nothing\n", []string{"empty"}},
		{"unknown top-level field", header + "profiles: default\n", []string{`"profiles"`, "line 3"}},
		{"unknown nested field", header + "checks:\n  thermal:\n    slowdown: 80\n", []string{`"slowdown"`, "line 5"}},
		{"unknown field in an override", header + "xids:\n  overrides:\n  - xids: [1]\n    severty: Healthy\n", []string{`"severty"`, "line 6"}},
		{"unknown check", header + "checks:\n  dcgm: {enabled: true}\n", []string{`"dcgm"`, "line 4"}},
		{"duplicate key", header + "profile: default\nprofile: device-plugin\n", []string{"profile", "line 4"}},
		{"two documents", header + "---\n" + header, []string{"one YAML document", "line"}},
		{"duration without a unit", header + "sampleInterval: 10\n", []string{`"10"`, "unit", "line 3"}},
		{"duration that is not one", header + "quietPeriod: soon\n", []string{`"soon"`, "line 3"}},
		{"boolean that is a string", header + "checks:\n  ecc: {enabled: \"maybe\"}\n", []string{"line 4", `"maybe"`}},
		{"number that is a string", header + "checks:\n  pcieReplays: {perMinute: lots}\n", []string{"line 4", `"lots"`}},
		{"negative XID", header + "xids:\n  overrides:\n  - {xids: [-1], severity: Healthy}\n", []string{"line 5", `"-1"`}},
		{"list where a mapping belongs", header + "checks: [ecc]\n", []string{"line 3"}},
		{"fraction for a whole number", header + "checks: {thermal: {recoverySamples: 2.5}}\n", []string{"line 3", `"2.5" is not a whole number`}},
		{"fractional XID", header + "xids:\n  overrides:\n  - {xids: [48.5], severity: Healthy}\n", []string{"line 5", `"48.5"`}},
		{"not YAML", header + "checks: {ecc: [\n", []string{"line"}},
		{"a tab", header + "checks:\n\tecc: {}\n", []string{"line"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.data))
			wantOneLine(t, err, tc.want...)
			if strings.Contains(err.Error(), "config.") || strings.Contains(err.Error(), "*") {
				t.Fatalf("error %q leaks Go type names", err)
			}
		})
	}
}

func wantOneLine(t *testing.T, err error, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", substrings)
	}
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\r\n") {
		t.Fatalf("error %q is not one non-empty line", msg)
	}
	for _, s := range substrings {
		if !strings.Contains(msg, s) {
			t.Fatalf("error %q does not mention %q", msg, s)
		}
	}
}

func TestValidationErrorsHaveFieldPaths(t *testing.T) {
	cases := []struct {
		name string
		data string
		path string
	}{
		{"wrong apiVersion", "apiVersion: gpuhealth.dev/v1\nkind: HealthConfig\n", "apiVersion"},
		{"missing apiVersion", "kind: HealthConfig\n", "apiVersion"},
		{"wrong kind", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\n", "kind"},
		{"unknown profile", header + "profile: strict\n", "profile"},
		{"sample interval too short", header + "sampleInterval: 1ms\n", "sampleInterval"},
		{"negative sample interval", header + "sampleInterval: -10s\n", "sampleInterval"},
		{"zero quiet period", header + "quietPeriod: 0s\n", "quietPeriod"},
		{"negative quiet period", header + "quietPeriod: -1m\n", "quietPeriod"},
		{"unknown rule severity", header + "xids: {unknown: {severity: Sick}}\n", "xids.unknown.severity"},
		{"unknown rule clearsOn", header + "xids: {unknown: {clearsOn: never}}\n", "xids.unknown.clearsOn"},
		{"empty recommended action", header + "xids: {unknown: {recommendedAction: \" \"}}\n", "xids.unknown.recommendedAction"},
		{"override severity", header + "xids:\n  overrides:\n  - {xids: [13], severity: Healthy}\n  - {xids: [48], severity: unhealthy}\n", "xids.overrides[1].severity"},
		{"override clearsOn", header + "xids:\n  overrides:\n  - {xids: [48], clearsOn: reset}\n", "xids.overrides[0].clearsOn"},
		{"override without XIDs", header + "xids:\n  overrides:\n  - {severity: Healthy}\n", "xids.overrides[0].xids"},
		{"override with XID 0", header + "xids:\n  overrides:\n  - {xids: [13, 0], severity: Healthy}\n", "xids.overrides[0].xids[1]"},
		{"override with a huge XID", header + "xids:\n  overrides:\n  - {xids: [4000000000], severity: Healthy}\n", "xids.overrides[0].xids[0]"},
		{"override that changes nothing", header + "xids:\n  overrides:\n  - {xids: [13]}\n", "xids.overrides[0]"},
		{"ECC storm rate zero", header + "checks: {ecc: {correctedStormPerMinute: 0}}\n", "checks.ecc.correctedStormPerMinute"},
		{"ECC storm rate NaN", header + "checks: {ecc: {correctedStormPerMinute: .nan}}\n", "checks.ecc.correctedStormPerMinute"},
		{"slowdown too hot", header + "checks: {thermal: {slowdownC: 151}}\n", "checks.thermal.slowdownC"},
		{"negative slowdown", header + "checks: {thermal: {slowdownC: -1}}\n", "checks.thermal.slowdownC"},
		{"negative shutdown", header + "checks: {thermal: {shutdownC: -5}}\n", "checks.thermal.shutdownC"},
		{"shutdown below slowdown", header + "checks: {thermal: {slowdownC: 90, shutdownC: 85}}\n", "checks.thermal.shutdownC"},
		{"shutdown equal to slowdown", header + "checks: {thermal: {slowdownC: 90, shutdownC: 90}}\n", "checks.thermal.shutdownC"},
		{"thermal recovery samples zero", header + "checks: {thermal: {recoverySamples: 0}}\n", "checks.thermal.recoverySamples"},
		{"thermal recovery samples too many", header + "checks: {thermal: {recoverySamples: 1001}}\n", "checks.thermal.recoverySamples"},
		{"clock reason", header + "checks: {clockEvents: {reasons: [hwSlowdown, hot]}}\n", "checks.clockEvents.reasons[1]"},
		{"clock recovery samples", header + "checks: {clockEvents: {recoverySamples: -2}}\n", "checks.clockEvents.recoverySamples"},
		{"PCIe rate zero", header + "checks: {pcieReplays: {perMinute: 0}}\n", "checks.pcieReplays.perMinute"},
		{"PCIe rate NaN", header + "checks: {pcieReplays: {perMinute: .NaN}}\n", "checks.pcieReplays.perMinute"},
		{"PCIe recovery samples", header + "checks: {pcieReplays: {recoverySamples: 0}}\n", "checks.pcieReplays.recoverySamples"},
		{"NVLink rate negative", header + "checks: {nvlink: {errorsPerMinute: -1}}\n", "checks.nvlink.errorsPerMinute"},
		{"NVLink rate NaN", header + "checks: {nvlink: {errorsPerMinute: .nan}}\n", "checks.nvlink.errorsPerMinute"},
		{"NVLink recovery samples", header + "checks: {nvlink: {recoverySamples: 5000}}\n", "checks.nvlink.recoverySamples"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.data))
			wantOneLine(t, err, tc.path+": ")
			var fe *config.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v has no FieldError", err)
			}
			var paths []string
			var fes config.FieldErrors
			if errors.As(err, &fes) {
				for _, e := range fes {
					paths = append(paths, e.Path)
				}
			}
			found := false
			for _, p := range paths {
				found = found || p == tc.path
			}
			if !found {
				t.Fatalf("field paths %q, want %q among them", paths, tc.path)
			}
		})
	}
}

func TestValidationReportsEveryProblemAtOnce(t *testing.T) {
	data := header + `profile: nope
quietPeriod: 0s
xids:
  overrides:
  - {xids: [48], severity: Sick}
checks:
  thermal: {recoverySamples: 0}
`
	_, err := config.Parse([]byte(data))
	wantOneLine(t, err, "profile: ", "quietPeriod: ", "xids.overrides[0].severity: ", "checks.thermal.recoverySamples: ")
	var fes config.FieldErrors
	if !errors.As(err, &fes) || len(fes) != 4 {
		t.Fatalf("FieldErrors %v, want 4", fes)
	}
}

func TestOverrides(t *testing.T) {
	p := mustPolicy(t, `xids:
  unknown: {severity: Degraded, clearsOn: quietPeriod}
  overrides:
  - {xids: [48, 13], severity: Degraded}
  - {xids: [48], clearsOn: nodeReboot, recommendedAction: callVendor}
  - {xids: [79], evict: false}
  - {xids: [5000], evict: true}
  - {xids: [154], severity: Unhealthy}
`)
	cases := []struct {
		xid  uint32
		want health.XIDRule
	}{
		// Later entries win, and an entry keeps the fields it does not set.
		{48, health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnNodeReboot, Action: "callVendor", Description: health.XIDTable()[48].Description}},
		// An application XID made Degraded keeps its table clearsOn.
		{13, health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnGPUReset, Action: health.ActionRestartApplication, Description: health.XIDTable()[13].Description}},
		{79, health.XIDRule{Severity: health.Unhealthy, ClearsOn: health.ClearsOnNodeReboot, Action: health.ActionRebootNode, Description: health.XIDTable()[79].Description}},
		// An override of an unknown XID starts from xids.unknown.
		{5000, health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnQuietPeriod, Evict: true, Action: health.ActionResetGPU, Description: "XID 5000 (configured)"}},
		// An override is explicit: XID 154 no longer defers to the recovery action.
		{154, health.XIDRule{Severity: health.Unhealthy, ClearsOn: health.ClearsOnGPUReset, Action: health.ActionInspect, Description: health.XIDTable()[154].Description}},
	}
	for _, tc := range cases {
		got, known := p.XIDRuleFor(tc.xid)
		if !known || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("XID %d: %+v (known %v), want %+v", tc.xid, got, known, tc.want)
		}
	}
	if got, known := p.XIDRuleFor(6000); known || got.Severity != health.Degraded || got.ClearsOn != health.ClearsOnQuietPeriod {
		t.Errorf("unknown XID rule %+v", got)
	}
	// Nothing else in the table moved.
	base := health.DefaultPolicy()
	for xid, r := range base.XIDs {
		switch xid {
		case 48, 13, 79, 154:
			continue
		}
		if p.XIDs[xid] != r {
			t.Errorf("XID %d changed: %+v", xid, p.XIDs[xid])
		}
	}
}

func TestConfiguredPolicyDrivesTheTracker(t *testing.T) {
	cases := []struct {
		name   string
		body   string
		signal health.Signal
		want   health.Severity
	}{
		{"unknown XIDs ignored", "xids: {unknown: {severity: Healthy}}\n", health.XIDSignal("GPU-0", 777, time.Unix(0, 0)), health.Healthy},
		{"unknown XIDs degraded", "xids: {unknown: {severity: Degraded}}\n", health.XIDSignal("GPU-0", 777, time.Unix(0, 0)), health.Degraded},
		{"XID 109 ignored", "xids: {overrides: [{xids: [109], severity: Healthy}]}\n", health.XIDSignal("GPU-0", 109, time.Unix(0, 0)), health.Healthy},
		{"XID 13 made unhealthy", "xids: {overrides: [{xids: [13], severity: Unhealthy}]}\n", health.XIDSignal("GPU-0", 13, time.Unix(0, 0)), health.Unhealthy},
		{"device-plugin profile, XID 109 made unhealthy", "profile: device-plugin\nxids: {overrides: [{xids: [109], severity: Unhealthy}]}\n", health.XIDSignal("GPU-0", 109, time.Unix(0, 0)), health.Unhealthy},
		{"lower slowdown", "checks: {thermal: {slowdownC: 70}}\n", health.Signal{Kind: health.SignalTemperature, Device: "GPU-0", Value: 75, SlowdownC: 90, ShutdownC: 95}, health.Degraded},
		{"higher shutdown", "checks: {thermal: {slowdownC: 95, shutdownC: 100}}\n", health.Signal{Kind: health.SignalTemperature, Device: "GPU-0", Value: 97, SlowdownC: 90, ShutdownC: 95}, health.Degraded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := health.NewTracker(mustPolicy(t, tc.body), []health.Device{{UUID: "GPU-0"}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tr.Observe(tc.signal, nil); err != nil {
				t.Fatal(err)
			}
			if got := tr.Snapshot().Devices[0].Health; got != tc.want {
				t.Fatalf("health %v, want %v", got, tc.want)
			}
		})
	}
}

func TestDurations(t *testing.T) {
	c := mustParse(t, "sampleInterval: 250ms\nquietPeriod: 1h30m\n")
	if c.SampleEvery() != 250*time.Millisecond {
		t.Fatalf("SampleEvery() = %v", c.SampleEvery())
	}
	p, err := c.Policy()
	if err != nil || p.QuietPeriod != 90*time.Minute {
		t.Fatalf("quiet period %v, %v", p.QuietPeriod, err)
	}
	if b, _ := (*c.QuietPeriod).MarshalText(); string(b) != "1h30m0s" {
		t.Fatalf("MarshalText = %q", b)
	}
}

func TestCheckToggles(t *testing.T) {
	cases := []struct {
		name    string
		check   string
		enabled func(*health.Policy) bool
	}{
		{"ecc", "ecc", func(p *health.Policy) bool { return p.ECC.Enabled }},
		{"rowRemap", "rowRemap", func(p *health.Policy) bool { return p.RowRemap.Enabled }},
		{"retiredPages", "retiredPages", func(p *health.Policy) bool { return p.RetiredPages.Enabled }},
		{"thermal", "thermal", func(p *health.Policy) bool { return p.Thermal.Enabled }},
		{"clockEvents", "clockEvents", func(p *health.Policy) bool { return p.ClockEvents.Enabled }},
		{"pcieReplays", "pcieReplays", func(p *health.Policy) bool { return p.PCIeReplays.Enabled }},
		{"nvlink", "nvlink", func(p *health.Policy) bool { return p.NVLink.Enabled }},
		{"recoveryAction", "recoveryAction", func(p *health.Policy) bool { return p.RecoveryAction.Enabled }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.enabled(mustPolicy(t, "")) {
				t.Fatal("not on by default")
			}
			off := mustPolicy(t, "checks: {"+tc.check+": {enabled: false}}\n")
			if tc.enabled(off) {
				t.Fatal("enabled: false left it on")
			}
			// Turning one check off leaves every other alone.
			for _, other := range cases {
				if other.name != tc.name && !other.enabled(off) {
					t.Fatalf("turning %s off turned %s off", tc.name, other.name)
				}
			}
			if tc.enabled(mustPolicy(t, "profile: device-plugin\n")) {
				t.Fatal("on in the device-plugin profile")
			}
			if !tc.enabled(mustPolicy(t, "profile: device-plugin\nchecks: {"+tc.check+": {enabled: true}}\n")) {
				t.Fatal("enabled: true left it off in the device-plugin profile")
			}
		})
	}
}

// A check turned on in the device-plugin profile works with the documented defaults, not with
// zero thresholds that would fire on the first replay or the first corrected error.
func TestDevicePluginProfileWithACheckTurnedOnUsesDefaultThresholds(t *testing.T) {
	p := mustPolicy(t, `profile: device-plugin
checks:
  ecc: {enabled: true}
  thermal: {enabled: true}
  clockEvents: {enabled: true}
  pcieReplays: {enabled: true}
  nvlink: {enabled: true}
`)
	if p.ECC.CorrectedStormPerMinute != health.DefaultCorrectedStormPerMinute ||
		p.Thermal.RecoverySamples != health.DefaultRecoverySamples ||
		p.ClockEvents.Reasons != health.DefaultPolicy().ClockEvents.Reasons || p.ClockEvents.RecoverySamples != health.DefaultRecoverySamples ||
		p.PCIeReplays.PerMinute != health.DefaultPCIeReplaysPerMinute || p.PCIeReplays.RecoverySamples != health.DefaultRecoverySamples ||
		p.NVLink.ErrorsPerMinute != health.DefaultNVLinkErrorsPerMinute || p.NVLink.RecoverySamples != health.DefaultRecoverySamples {
		t.Fatalf("device-plugin profile with checks on: %+v", p)
	}
	tr, err := health.NewTracker(p, []health.Device{{UUID: "GPU-0"}})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	for _, s := range []health.Signal{
		{Kind: health.SignalPCIeReplays, Value: 0, Time: t0},
		{Kind: health.SignalPCIeReplays, Value: 1, Time: t0.Add(time.Minute)},
		{Kind: health.SignalECCCounters, Corrected: 0, Time: t0},
		{Kind: health.SignalECCCounters, Corrected: 1, Time: t0.Add(time.Minute)},
		{Kind: health.SignalClockEvents, Reasons: health.ClockEventSWThermalSlowdown, Time: t0},
	} {
		s.Device = "GPU-0"
		if _, err := tr.Observe(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := tr.Snapshot().Devices[0]; got.Health != health.Healthy {
		t.Fatalf("one replay and one corrected error a minute made the GPU %v: %+v", got.Health, got.Conditions)
	}
}

func TestThresholdOverrides(t *testing.T) {
	p := mustPolicy(t, `checks:
  ecc: {correctedStormPerMinute: 5}
  thermal: {slowdownC: 80, shutdownC: 85, recoverySamples: 7}
  clockEvents: {reasons: [swThermalSlowdown], recoverySamples: 2}
  pcieReplays: {perMinute: 1.5, recoverySamples: 4}
  nvlink: {errorsPerMinute: 2, recoverySamples: 5}
`)
	if p.ECC.CorrectedStormPerMinute != 5 || p.Thermal.SlowdownC != 80 || p.Thermal.ShutdownC != 85 || p.Thermal.RecoverySamples != 7 ||
		p.ClockEvents.Reasons != health.ClockEventSWThermalSlowdown || p.ClockEvents.RecoverySamples != 2 ||
		p.PCIeReplays.PerMinute != 1.5 || p.PCIeReplays.RecoverySamples != 4 ||
		p.NVLink.ErrorsPerMinute != 2 || p.NVLink.RecoverySamples != 5 {
		t.Fatalf("policy %+v", p)
	}
	// Every check still on: a threshold is not a toggle.
	if !p.ECC.Enabled || !p.Thermal.Enabled || !p.ClockEvents.Enabled || !p.PCIeReplays.Enabled || !p.NVLink.Enabled {
		t.Fatal("setting a threshold turned a check off")
	}
	// An empty reason list watches nothing.
	if p := mustPolicy(t, "checks: {clockEvents: {reasons: []}}\n"); p.ClockEvents.Reasons != 0 {
		t.Fatalf("reasons %v, want none", p.ClockEvents.Reasons)
	}
}

func TestPolicyDoesNotShareTheProfile(t *testing.T) {
	a := mustPolicy(t, "xids: {overrides: [{xids: [48], severity: Healthy}]}\n")
	b := mustPolicy(t, "")
	if a.XIDs[48].Severity != health.Healthy || b.XIDs[48].Severity != health.Unhealthy || health.DefaultPolicy().XIDs[48].Severity != health.Unhealthy {
		t.Fatal("one config's override leaked into another policy")
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := config.Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"checks: {thermal: {recoverySamples: 0}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := config.Load(bad)
	wantOneLine(t, err, bad+": ", "checks.thermal.recoverySamples")
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(header+"profile: device-plugin\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := config.Load(good); err != nil || c.Profile != "device-plugin" {
		t.Fatalf("Load: %+v, %v", c, err)
	}
}

func policyString(p *health.Policy) string { return fmt.Sprintf("%+v", *p) }

func TestDurationIsATextUnmarshaler(t *testing.T) {
	var _ encoding.TextUnmarshaler = (*config.Duration)(nil)
	var d config.Duration
	if err := json.Unmarshal([]byte(`"1m30s"`), &d); err != nil || time.Duration(d) != 90*time.Second {
		t.Fatalf("JSON 1m30s = %v, %v", time.Duration(d), err)
	}
	for _, bad := range []string{"10", "0", "", "soon", "1.5"} {
		if err := d.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "unit") {
			t.Errorf("UnmarshalText(%q) = %v, want an error asking for a unit", bad, err)
		}
	}
	if b, err := json.Marshal(config.Duration(2 * time.Hour)); err != nil || string(b) != `"2h0m0s"` {
		t.Fatalf("json.Marshal = %s, %v", b, err)
	}
}

func TestLoadPolicy(t *testing.T) {
	cfg, p, err := config.LoadPolicy("")
	if err != nil || cfg.Profile != "default" || !reflect.DeepEqual(p, health.DefaultPolicy()) {
		t.Fatalf("LoadPolicy(\"\") = %+v, %v; want the default profile and health.DefaultPolicy()", cfg, err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(header+"quietPeriod: soon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := config.LoadPolicy(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadPolicy(bad file) = %v, want an error naming %s", err, path)
	}
}
