package health_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestUncorrectedECCIsUnhealthyUntilReset(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	if got := h.signal(health.SignalECCCounters, uuid, 0, withECC(0, 0)); len(got) != 0 {
		t.Fatalf("clean counters: %+v", got)
	}
	wantTransitions(t, h.signal(health.SignalECCCounters, uuid, time.Second, withECC(0, 1)),
		tr(uuid, health.Healthy, health.Unhealthy, "UncorrectedECCErrors"))
	c := h.mustCondition(uuid, health.ConditionECCUncorrected, 0)
	if c.ClearsOn != health.ClearsOnGPUReset || c.Severity != health.Unhealthy {
		t.Fatalf("condition %+v", c)
	}
	// More errors, and even a reading of zero without a reset, change nothing.
	h.signal(health.SignalECCCounters, uuid, 2*time.Second, withECC(0, 7))
	for i := range 10 {
		h.signal(health.SignalECCCounters, uuid, time.Duration(3+i)*time.Second, withECC(0, 0))
	}
	h.wantHealth(uuid, health.Unhealthy, false)
	wantTransitions(t, h.reset(uuid, time.Minute), tr(uuid, health.Unhealthy, health.Healthy, health.ReasonGPUReset))
	// After the reset the counters start from zero again and stay clean.
	h.signal(health.SignalECCCounters, uuid, 2*time.Minute, withECC(0, 0))
	h.wantHealth(uuid, health.Healthy, false)
}

func TestRowRemapFailureIsUnhealthy(t *testing.T) {
	p := health.DefaultPolicy()
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.signal(health.SignalRemappedRows, uuid, 0, withFailure(true)),
		tr(uuid, health.Healthy, health.Unhealthy, "RowRemapFailure"))
	// The failure is permanent hardware state: a reset does not end it while the reading says so.
	h.reset(uuid, time.Second)
	for i := range 10 {
		h.signal(health.SignalRemappedRows, uuid, time.Duration(2+i)*time.Second, withFailure(true))
	}
	h.wantHealth(uuid, health.Unhealthy, false)
}

func TestPendingRepairsAreDegradedUntilReset(t *testing.T) {
	cases := []struct {
		name   string
		kind   health.SignalKind
		cond   health.ConditionType
		reason string
	}{
		{"row remap pending", health.SignalRemappedRows, health.ConditionRowRemapPending, "RowRemapPending"},
		{"retired pages pending", health.SignalRetiredPages, health.ConditionRetiredPagesPending, "RetiredPagesPending"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			h.signal(tc.kind, uuid, 0, withPending(false))
			h.wantHealth(uuid, health.Healthy, false)
			wantTransitions(t, h.signal(tc.kind, uuid, time.Second, withPending(true)),
				tr(uuid, health.Healthy, health.Degraded, tc.reason))
			if c := h.mustCondition(uuid, tc.cond, 0); c.ClearsOn != health.ClearsOnGPUReset {
				t.Fatalf("condition %+v, want clearsOn gpuReset", c)
			}
			// Readings without the flag do not end it: only the reset applies the repair.
			for i := range 5 {
				h.signal(tc.kind, uuid, time.Duration(2+i)*time.Second, withPending(false))
			}
			h.tick(forever)
			h.wantHealth(uuid, health.Degraded, false)
			wantTransitions(t, h.reset(uuid, forever), tr(uuid, health.Degraded, health.Healthy, health.ReasonGPUReset))
		})
	}
}

func TestCorrectedECCStormIsARate(t *testing.T) {
	const limit = int64(health.DefaultCorrectedStormPerMinute)
	cases := []struct {
		name    string
		samples []reading
		want    health.Severity
	}{
		{"first sample only sets a baseline", readings(0, 1e12), health.Healthy},
		{"at the limit", readings(0, 0, 60, limit), health.Healthy},
		{"above the limit", readings(0, 0, 60, limit+1), health.Degraded},
		{"above the limit over ten seconds", readings(0, 0, 10, limit/6+1), health.Degraded},
		{"slowly over an hour", readings(0, 0, 3600, 50*limit), health.Healthy},
		{"counter went backwards: a new baseline", readings(0, 1e9, 60, 10, 120, 20), health.Healthy},
		{"several samples at one instant count toward the next rate", readings(0, 0, 0, limit+1, 60, limit+1), health.Degraded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			for _, s := range tc.samples {
				h.signal(health.SignalECCCounters, uuid, s.at, withECC(uint64(s.v), 0))
			}
			h.wantHealth(uuid, tc.want, false)
			if tc.want != health.Healthy {
				c := h.mustCondition(uuid, health.ConditionECCCorrectedStorm, 0)
				if c.ClearsOn != health.ClearsOnQuietPeriod || c.Reason != "SingleBitECCStorm" {
					t.Fatalf("condition %+v", c)
				}
			}
		})
	}
}

// reading is one sample of a polled value at an offset from t0.
type reading struct {
	at time.Duration
	v  int64
}

// readings builds readings from (seconds, value) pairs.
func readings(pairs ...int64) []reading {
	var out []reading
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, reading{time.Duration(pairs[i]) * time.Second, pairs[i+1]})
	}
	return out
}

func TestCorrectedECCStormClearsAfterAQuietPeriod(t *testing.T) {
	p := health.DefaultPolicy()
	p.QuietPeriod = 5 * time.Minute
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalECCCounters, uuid, 0, withECC(0, 0))
	h.signal(health.SignalECCCounters, uuid, 10*time.Second, withECC(5000, 0))
	h.wantHealth(uuid, health.Degraded, false)
	// Clean samples every 10s: the storm is over, but only the quiet period ends the condition.
	var cleared time.Duration
	for d := 20 * time.Second; d <= 10*time.Minute; d += 10 * time.Second {
		if got := h.signal(health.SignalECCCounters, uuid, d, withECC(5000, 0)); len(got) > 0 {
			wantTransitions(t, got, tr(uuid, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
			cleared = d
			break
		}
	}
	if want := 10*time.Second + p.QuietPeriod; cleared != want {
		t.Fatalf("storm cleared at %v, want %v", cleared, want)
	}
}

func TestECCStormEventIsDegradedUntilQuietPeriod(t *testing.T) {
	p := health.DefaultPolicy()
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.signal(health.SignalECCStorm, uuid, 0), tr(uuid, health.Healthy, health.Degraded, "SingleBitECCStorm"))
	// Repeats keep it alive and produce nothing.
	for i := 1; i <= 5; i++ {
		if got := h.signal(health.SignalECCStorm, uuid, time.Duration(i)*time.Minute); len(got) != 0 {
			t.Fatalf("repeat %d: %+v", i, got)
		}
	}
	if got := h.tick(5*time.Minute + p.QuietPeriod - time.Second); len(got) != 0 {
		t.Fatalf("before the quiet period: %+v", got)
	}
	wantTransitions(t, h.tick(5*time.Minute+p.QuietPeriod), tr(uuid, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
}

func TestTemperatureThresholds(t *testing.T) {
	cases := []struct {
		name               string
		slowdown, shutdown int64 // the device's own thresholds (0: unknown)
		policy             func(*health.Policy)
		value              int64
		want               health.Severity
		reason             string
	}{
		{name: "idle", value: 35, want: health.Healthy},
		{name: "just below the default slowdown", value: health.DefaultSlowdownC - 1, want: health.Healthy},
		{name: "at the default slowdown", value: health.DefaultSlowdownC, want: health.Degraded, reason: "TemperatureAtSlowdown"},
		{name: "just below the default shutdown", value: health.DefaultShutdownC - 1, want: health.Degraded, reason: "TemperatureAtSlowdown"},
		{name: "at the default shutdown", value: health.DefaultShutdownC, want: health.Unhealthy, reason: "TemperatureAtShutdown"},
		{name: "far above", value: 130, want: health.Unhealthy, reason: "TemperatureAtShutdown"},
		{name: "device's own slowdown", slowdown: 80, shutdown: 88, value: 80, want: health.Degraded, reason: "TemperatureAtSlowdown"},
		{name: "device's own shutdown", slowdown: 80, shutdown: 88, value: 88, want: health.Unhealthy, reason: "TemperatureAtShutdown"},
		{name: "device's own thresholds above the defaults", slowdown: 100, shutdown: 105, value: 99, want: health.Healthy},
		{
			name: "config slowdown overrides the device's", slowdown: 90, shutdown: 95, value: 70,
			policy: func(p *health.Policy) { p.Thermal.SlowdownC = 70 }, want: health.Degraded, reason: "TemperatureAtSlowdown",
		},
		{
			name: "config shutdown overrides the device's", slowdown: 90, shutdown: 95, value: 92,
			policy: func(p *health.Policy) { p.Thermal.ShutdownC = 92 }, want: health.Unhealthy, reason: "TemperatureAtShutdown",
		},
		{
			name: "config thresholds raise the bar", slowdown: 90, shutdown: 95, value: 96,
			policy: func(p *health.Policy) { p.Thermal.SlowdownC, p.Thermal.ShutdownC = 100, 110 }, want: health.Healthy,
		},
		{
			name: "check disabled", value: 130,
			policy: func(p *health.Policy) { p.Thermal.Enabled = false }, want: health.Healthy,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			if tc.policy != nil {
				tc.policy(p)
			}
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			h.signal(health.SignalTemperature, uuid, 0, withValue(tc.value), withThresholds(tc.slowdown, tc.shutdown))
			h.wantHealth(uuid, tc.want, false)
			if tc.want != health.Healthy {
				c := h.mustCondition(uuid, health.ConditionThermal, 0)
				if c.Reason != tc.reason || c.ClearsOn != health.ClearsOnRecovered || c.Message == "" {
					t.Fatalf("condition %+v, want reason %s until recovered", c, tc.reason)
				}
			}
		})
	}
}

func TestTemperatureHysteresis(t *testing.T) {
	const hot, warm, cool = 97, 91, 60
	cases := []struct {
		name     string
		samples  int // recovery samples in the policy
		readings []reading
		want     health.Severity
	}{
		{"one cool sample is not enough", 3, readings(0, hot, 10, cool), health.Unhealthy},
		{"two cool samples are not enough", 3, readings(0, hot, 10, cool, 20, cool), health.Unhealthy},
		{"three cool samples clear it", 3, readings(0, hot, 10, cool, 20, cool, 30, cool), health.Healthy},
		{"cool samples at one instant count once", 3, readings(0, hot, 10, cool, 10, cool, 10, cool, 10, cool), health.Unhealthy},
		{"a hot sample restarts the count", 3, readings(0, hot, 10, cool, 20, cool, 30, hot, 40, cool, 50, cool), health.Unhealthy},
		{"steps down to Degraded first", 3, readings(0, hot, 10, warm, 20, warm, 30, warm), health.Degraded},
		{"warm samples do not clear Degraded", 3, readings(0, warm, 10, warm, 20, warm, 30, warm), health.Degraded},
		{"Degraded clears after clean samples", 3, readings(0, warm, 10, cool, 20, cool, 30, cool), health.Healthy},
		{"worse takes effect at once", 3, readings(0, warm, 10, hot), health.Unhealthy},
		{"recovery samples from the policy", 5, readings(0, hot, 10, cool, 20, cool, 30, cool, 40, cool), health.Unhealthy},
		{"recovery samples from the policy, met", 5, readings(0, hot, 10, cool, 20, cool, 30, cool, 40, cool, 50, cool), health.Healthy},
		{"one recovery sample", 1, readings(0, hot, 10, cool), health.Healthy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			p.Thermal.RecoverySamples = tc.samples
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			for _, r := range tc.readings {
				h.signal(health.SignalTemperature, uuid, r.at, withValue(r.v))
			}
			h.wantHealth(uuid, tc.want, false)
		})
	}
}

func TestTemperatureTransitions(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	for i, c := range []int64{97, 97, 91, 91, 91, 91, 60, 60, 60} {
		h.signal(health.SignalTemperature, uuid, time.Duration(i)*10*time.Second, withValue(c))
	}
	wantTransitions(t, h.all,
		tr(uuid, health.Healthy, health.Unhealthy, "TemperatureAtShutdown"),
		tr(uuid, health.Unhealthy, health.Degraded, health.ReasonRecovered),
		tr(uuid, health.Degraded, health.Healthy, health.ReasonRecovered))
	if h.all[1].Time != at(40*time.Second) || h.all[2].Time != at(80*time.Second) {
		t.Fatalf("transition times %v, %v", h.all[1].Time, h.all[2].Time)
	}
}

func TestClockEventReasons(t *testing.T) {
	cases := []struct {
		name    string
		reasons health.ClockEventReasons
		policy  func(*health.Policy)
		want    health.Severity
	}{
		{name: "none", reasons: 0, want: health.Healthy},
		{name: "hwSlowdown", reasons: health.ClockEventHWSlowdown, want: health.Degraded},
		{name: "hwThermalSlowdown", reasons: health.ClockEventHWThermalSlowdown, want: health.Degraded},
		{name: "hwPowerBrake", reasons: health.ClockEventHWPowerBrake, want: health.Degraded},
		{name: "swThermalSlowdown", reasons: health.ClockEventSWThermalSlowdown, want: health.Healthy},
		{name: "unnamed bits", reasons: 0x1 | 0x2 | 0x4 | 0x100, want: health.Healthy},
		{name: "several", reasons: health.ClockEventSWThermalSlowdown | health.ClockEventHWPowerBrake, want: health.Degraded},
		{
			name: "configured to watch swThermalSlowdown only", reasons: health.ClockEventSWThermalSlowdown,
			policy: func(p *health.Policy) { p.ClockEvents.Reasons = health.ClockEventSWThermalSlowdown }, want: health.Degraded,
		},
		{
			name: "configured without hwSlowdown", reasons: health.ClockEventHWSlowdown,
			policy: func(p *health.Policy) { p.ClockEvents.Reasons = health.ClockEventHWPowerBrake }, want: health.Healthy,
		},
		{
			name: "check disabled", reasons: health.ClockEventHWSlowdown,
			policy: func(p *health.Policy) { p.ClockEvents.Enabled = false }, want: health.Healthy,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			if tc.policy != nil {
				tc.policy(p)
			}
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			h.signal(health.SignalClockEvents, uuid, 0, withReasons(tc.reasons))
			h.wantHealth(uuid, tc.want, false)
			if tc.want == health.Healthy {
				return
			}
			c := h.mustCondition(uuid, health.ConditionClockThrottle, 0)
			if c.Reason != "ClocksThrottled" || c.ClearsOn != health.ClearsOnRecovered {
				t.Fatalf("condition %+v", c)
			}
			// It clears after the policy's recovery samples without the reasons it watches.
			unwatched := (health.ClockEventHWSlowdown | health.ClockEventHWThermalSlowdown | health.ClockEventHWPowerBrake |
				health.ClockEventSWThermalSlowdown) &^ p.ClockEvents.Reasons
			n := p.ClockEvents.RecoverySamples
			for i := 1; i < n; i++ {
				h.signal(health.SignalClockEvents, uuid, time.Duration(i)*time.Second, withReasons(unwatched))
			}
			h.wantHealth(uuid, health.Degraded, false)
			h.signal(health.SignalClockEvents, uuid, time.Duration(n)*time.Second, withReasons(0))
			h.wantHealth(uuid, health.Healthy, false)
		})
	}
}

// rateCase drives a counter check with (seconds, counter total) samples.
type rateCase struct {
	name    string
	samples [][2]int64
	policy  func(*health.Policy)
	want    health.Severity
}

// rateCases are the cases every counter-rate check must pass; setLimit sets the check's limit
// and disable turns it off.
func rateCases(limitPerMinute int64, setLimit func(*health.Policy, float64), disable func(*health.Policy)) []rateCase {
	l := limitPerMinute
	return []rateCase{
		{name: "first sample only sets a baseline", samples: [][2]int64{{0, 1 << 40}}, want: health.Healthy},
		{name: "at the limit", samples: [][2]int64{{0, 0}, {60, l}}, want: health.Healthy},
		{name: "above the limit", samples: [][2]int64{{0, 0}, {60, l + 1}}, want: health.Degraded},
		{name: "above the limit over ten seconds", samples: [][2]int64{{0, 100}, {10, 100 + l/6 + 1}}, want: health.Degraded},
		{name: "a large total with a low rate", samples: [][2]int64{{0, 1 << 40}, {60, 1<<40 + l/2}}, want: health.Healthy},
		{name: "counter went backwards: a new baseline", samples: [][2]int64{{0, 1 << 40}, {60, 5}, {120, 5 + l/2}}, want: health.Healthy},
		{name: "same instant counts toward the next rate", samples: [][2]int64{{0, 0}, {0, 10 * l}, {60, 10 * l}}, want: health.Degraded},
		{name: "threshold from the policy", samples: [][2]int64{{0, 0}, {60, 2 * l}}, policy: func(p *health.Policy) { setLimit(p, float64(3*l)) }, want: health.Healthy},
		{name: "check disabled", samples: [][2]int64{{0, 0}, {60, 100 * l}}, policy: disable, want: health.Healthy},
	}
}

func TestPCIeReplayRate(t *testing.T) {
	for _, tc := range rateCases(health.DefaultPCIeReplaysPerMinute,
		func(p *health.Policy, v float64) { p.PCIeReplays.PerMinute = v },
		func(p *health.Policy) { p.PCIeReplays.Enabled = false }) {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			if tc.policy != nil {
				tc.policy(p)
			}
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			for _, s := range tc.samples {
				h.signal(health.SignalPCIeReplays, uuid, time.Duration(s[0])*time.Second, withValue(s[1]))
			}
			h.wantHealth(uuid, tc.want, false)
			if tc.want != health.Healthy {
				if c := h.mustCondition(uuid, health.ConditionPCIeReplayRate, 0); c.Reason != "PCIeReplayRateHigh" {
					t.Fatalf("condition %+v", c)
				}
			}
		})
	}
}

func TestNVLinkErrorRate(t *testing.T) {
	for _, tc := range rateCases(health.DefaultNVLinkErrorsPerMinute,
		func(p *health.Policy, v float64) { p.NVLink.ErrorsPerMinute = v },
		func(p *health.Policy) { p.NVLink.Enabled = false }) {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			if tc.policy != nil {
				tc.policy(p)
			}
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			for _, s := range tc.samples {
				h.signal(health.SignalNVLinkErrors, uuid, time.Duration(s[0])*time.Second, withLink(3), withValue(s[1]))
				// Another link with a steady counter is never the one blamed.
				h.signal(health.SignalNVLinkErrors, uuid, time.Duration(s[0])*time.Second, withLink(1), withValue(7))
			}
			h.wantHealth(uuid, tc.want, false)
			if _, ok := h.condition(uuid, health.ConditionNVLinkErrorRate, 1); ok {
				t.Fatal("link 1 blamed")
			}
			if tc.want != health.Healthy {
				if c := h.mustCondition(uuid, health.ConditionNVLinkErrorRate, 3); c.Reason != "NVLinkErrorRateHigh" {
					t.Fatalf("condition %+v", c)
				}
			}
		})
	}
}

func TestRatesRecoverAfterCleanSamples(t *testing.T) {
	cases := []struct {
		name string
		kind health.SignalKind
		cond health.ConditionType
		code uint32
	}{
		{"pcie", health.SignalPCIeReplays, health.ConditionPCIeReplayRate, 0},
		{"nvlink", health.SignalNVLinkErrors, health.ConditionNVLinkErrorRate, 5},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			total := int64(0)
			h.signal(tc.kind, uuid, 0, withLink(tc.code), withValue(total))
			total += 1000
			wantTransitions(t, h.signal(tc.kind, uuid, 10*time.Second, withLink(tc.code), withValue(total)),
				tr(uuid, health.Healthy, health.Degraded, h.mustCondition(uuid, tc.cond, tc.code).Reason))
			n := p.PCIeReplays.RecoverySamples
			for i := 1; i <= n; i++ {
				total++ // 6/min: well under the limit
				got := h.signal(tc.kind, uuid, time.Duration(10+10*i)*time.Second, withLink(tc.code), withValue(total))
				if i < n && len(got) != 0 {
					t.Fatalf("sample %d: %+v", i, got)
				}
				if i == n {
					wantTransitions(t, got, tr(uuid, health.Degraded, health.Healthy, health.ReasonRecovered))
				}
			}
		})
	}
}

func TestRatesRestartAfterReset(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalPCIeReplays, uuid, 0, withValue(1_000_000))
	h.reset(uuid, 10*time.Second)
	// The counter restarted at zero: the first reading after the reset is a new baseline, not a
	// huge negative or positive rate.
	h.signal(health.SignalPCIeReplays, uuid, 20*time.Second, withValue(1_000_001))
	h.signal(health.SignalPCIeReplays, uuid, 30*time.Second, withValue(1_000_002))
	h.wantHealth(uuid, health.Healthy, false)
}

func TestNVLinkDownIsUnhealthy(t *testing.T) {
	p := health.DefaultPolicy()
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalNVLinkState, uuid, 0, withLink(2), withDown(false))
	h.wantHealth(uuid, health.Healthy, false)
	wantTransitions(t, h.signal(health.SignalNVLinkState, uuid, time.Second, withLink(2), withDown(true)),
		tr(uuid, health.Healthy, health.Unhealthy, "NVLinkDown"))
	h.signal(health.SignalNVLinkState, uuid, time.Second, withLink(4), withDown(true))
	if c := h.mustCondition(uuid, health.ConditionNVLinkDown, 2); c.Message == "" || c.ClearsOn != health.ClearsOnRecovered {
		t.Fatalf("condition %+v", c)
	}
	h.mustCondition(uuid, health.ConditionNVLinkDown, 4)
	// Link 2 comes back; link 4 is still down, so the GPU stays Unhealthy.
	for i := 1; i <= p.NVLink.RecoverySamples; i++ {
		h.signal(health.SignalNVLinkState, uuid, time.Duration(1+i)*time.Second, withLink(2), withDown(false))
		h.signal(health.SignalNVLinkState, uuid, time.Duration(1+i)*time.Second, withLink(4), withDown(true))
	}
	if _, ok := h.condition(uuid, health.ConditionNVLinkDown, 2); ok {
		t.Fatal("link 2 still reported down after clean samples")
	}
	h.wantHealth(uuid, health.Unhealthy, false)
	p.NVLink.Enabled = false
	h2 := newHarness(t, p)
	h2.signal(health.SignalNVLinkState, uuid, 0, withLink(2), withDown(true))
	h2.wantHealth(uuid, health.Healthy, false)
}

func TestGPULost(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.signal(health.SignalLost, uuid, 0), tr(uuid, health.Healthy, health.Unhealthy, "GPULost"))
	c := h.mustCondition(uuid, health.ConditionGPULost, 0)
	if !c.Evict || c.ClearsOn != health.ClearsOnNodeReboot {
		t.Fatalf("condition %+v", c)
	}
	h.reset(uuid, time.Second)
	h.tick(forever)
	h.wantHealth(uuid, health.Unhealthy, true)
	h.reboot("boot-2", forever)
	h.wantHealth(uuid, health.Healthy, false)
}

func TestDisabledChecksChangeNothing(t *testing.T) {
	cases := []struct {
		name    string
		disable func(*health.Policy)
		signals []health.Signal
	}{
		{"ecc", func(p *health.Policy) { p.ECC.Enabled = false }, []health.Signal{
			{Kind: health.SignalECCCounters, Corrected: 0},
			{Kind: health.SignalECCCounters, Corrected: 1e9, Uncorrected: 10, Time: at(time.Second)},
			{Kind: health.SignalECCStorm},
		}},
		{"row remap", func(p *health.Policy) { p.RowRemap.Enabled = false }, []health.Signal{
			{Kind: health.SignalRemappedRows, Pending: true, Failure: true},
		}},
		{"retired pages", func(p *health.Policy) { p.RetiredPages.Enabled = false }, []health.Signal{
			{Kind: health.SignalRetiredPages, Pending: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := health.DefaultPolicy()
			tc.disable(p)
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			for _, s := range tc.signals {
				s.Device = uuid
				if s.Time.IsZero() {
					s.Time = at(0)
				}
				h.observe(s)
			}
			h.wantHealth(uuid, health.Healthy, false)
		})
	}
}

func TestMessagesNameTheReading(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalTemperature, uuid, 0, withValue(97))
	h.signal(health.SignalECCCounters, uuid, 0, withECC(0, 3))
	h.signal(health.SignalClockEvents, uuid, 0, withReasons(health.ClockEventHWPowerBrake))
	for typ, want := range map[health.ConditionType]string{
		health.ConditionThermal:        "97",
		health.ConditionECCUncorrected: "3",
		health.ConditionClockThrottle:  "hwPowerBrake",
	} {
		if c := h.mustCondition(uuid, typ, 0); !strings.Contains(c.Message, want) {
			t.Errorf("%s message %q does not mention %q", typ, c.Message, want)
		}
	}
}
