package nvml_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	gpuapi "github.com/gpuhealth/gpuhealth/pkg/gpu"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/healthtest"
)

// newMonitor returns a Monitor over b's inventory with the default policy.
func newMonitor(t *testing.T, b *gpunvml.Backend) *health.Monitor {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), b.Devices())
	if err != nil {
		t.Fatal(err)
	}
	return health.NewMonitor(tr)
}

func TestSamplingRound(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) {
		s.corrected, s.uncorrected = 3, 0
		s.rowsPending = true
		s.temperature = 88
		s.reasons = uint64(health.ClockEventHWSlowdown)
		s.replays = 12
		s.links[1] = nvml.FEATURE_DISABLED // never active: not watched
		s.linkErrors[0] = 5
		s.recovery = uint32(health.RecoveryNone)
	})
	b := f.open()
	rec := &healthtest.Recorder{}
	f.run(b, rec)
	got := rec.Take()
	var mine []health.Signal
	for _, s := range got {
		if s.Device == f.uuid(0) {
			s.Time = s.Time.UTC()
			mine = append(mine, s)
		}
	}
	base := health.Signal{Device: f.uuid(0), Time: start}
	with := func(change func(*health.Signal)) health.Signal {
		s := base
		change(&s)
		return s
	}
	want := []health.Signal{
		with(func(s *health.Signal) { s.Kind, s.Corrected = health.SignalECCCounters, 3 }),
		with(func(s *health.Signal) { s.Kind, s.Pending = health.SignalRemappedRows, true }),
		with(func(s *health.Signal) {
			s.Kind, s.Value, s.SlowdownC, s.ShutdownC = health.SignalTemperature, 88, 87, 92
		}),
		with(func(s *health.Signal) { s.Kind, s.Reasons = health.SignalClockEvents, health.ClockEventHWSlowdown }),
		with(func(s *health.Signal) { s.Kind, s.Value = health.SignalPCIeReplays, 12 }),
		with(func(s *health.Signal) { s.Kind = health.SignalRowRemapHistogram }),
		with(func(s *health.Signal) { s.Kind = health.SignalSRAMThreshold }),
		with(func(s *health.Signal) {
			s.Kind, s.PCIe = health.SignalPCIeLink, health.PCIeLinkReading{Gen: 5, MaxGen: 5, Width: 16, MaxWidth: 16}
		}),
		with(func(s *health.Signal) {
			s.Kind, s.Fabric = health.SignalFabric, health.FabricReading{State: health.FabricCompleted}
		}),
		with(func(s *health.Signal) { s.Kind, s.Link = health.SignalNVLinkState, 0 }),
		with(func(s *health.Signal) { s.Kind, s.Link, s.Value = health.SignalNVLinkErrors, 0, 5 }),
		with(func(s *health.Signal) { s.Kind, s.Link, s.Value = health.SignalNVLinkRecoveries, 0, 0 }),
		with(func(s *health.Signal) { s.Kind, s.Action = health.SignalRecoveryAction, health.RecoveryNone }),
		with(func(s *health.Signal) { s.Kind = health.SignalSample }),
	}
	if !slices.Equal(mine, want) {
		t.Errorf("round:\n got %+v\nwant %+v", mine, want)
	}
}

func TestSamplingNotSupported(t *testing.T) {
	all := []string{
		gpunvml.ReadingECC, gpunvml.ReadingRemappedRows, gpunvml.ReadingRetiredPages, gpunvml.ReadingTemperature,
		gpunvml.ReadingPower, gpunvml.ReadingClockEvents, gpunvml.ReadingPCIeReplays, gpunvml.ReadingNVLink,
		gpunvml.ReadingRecoveryAction, gpunvml.ReadingRowRemapHistogram, gpunvml.ReadingSRAM, gpunvml.ReadingPCIeLink,
		"fabric", gpunvml.ReadingNVLinkRecoveries,
	}
	tests := []struct {
		name        string
		unsupported []string
		failing     []string
		wantKinds   []health.SignalKind
		wantErrors  uint64
	}{
		{
			name:        "nothing supported: only the end of the round",
			unsupported: all,
			wantKinds:   []health.SignalKind{health.SignalSample},
		},
		{
			name: "no thresholds: temperature without them",
			unsupported: []string{
				"thresholds", gpunvml.ReadingECC, gpunvml.ReadingRemappedRows, gpunvml.ReadingRetiredPages, gpunvml.ReadingClockEvents, gpunvml.ReadingPCIeReplays, gpunvml.ReadingNVLink, gpunvml.ReadingRecoveryAction,
				gpunvml.ReadingRowRemapHistogram, gpunvml.ReadingSRAM, gpunvml.ReadingPCIeLink, "fabric",
			},
			wantKinds: []health.SignalKind{health.SignalTemperature, health.SignalSample},
		},
		{
			name:       "failing readings are counted, not faults",
			failing:    []string{gpunvml.ReadingECC, gpunvml.ReadingTemperature},
			wantErrors: 2,
			wantKinds: []health.SignalKind{health.SignalRemappedRows, health.SignalClockEvents,
				health.SignalPCIeReplays, health.SignalRowRemapHistogram, health.SignalSRAMThreshold, health.SignalPCIeLink,
				health.SignalFabric, health.SignalNVLinkState, health.SignalNVLinkErrors, health.SignalNVLinkState,
				health.SignalNVLinkErrors, health.SignalNVLinkRecoveries, health.SignalNVLinkRecoveries, health.SignalRecoveryAction, health.SignalSample},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.update(0, func(s *gpuState) {
				for _, r := range tc.unsupported {
					s.unsupported[r] = true
				}
				for _, r := range tc.failing {
					s.failing[r] = true
				}
				s.temperature = 99
			})
			b := f.open()
			m := newMonitor(t, b)
			rec := &healthtest.Recorder{}
			f.run(b, teeSink{rec, m})
			got := rec.Take()
			if kinds := kindsOf(got, f.uuid(0)); !slices.Equal(kinds, tc.wantKinds) {
				t.Errorf("kinds = %v, want %v", kinds, tc.wantKinds)
			}
			for _, s := range got {
				if s.Device == f.uuid(0) && s.Kind == health.SignalTemperature && (s.SlowdownC != 0 || s.ShutdownC != 0) {
					t.Errorf("thresholds %d/%d, want 0 (unknown)", s.SlowdownC, s.ShutdownC)
				}
			}
			if n := b.Stats().SampleErrors; n != tc.wantErrors {
				t.Errorf("Stats.SampleErrors = %d, want %d", n, tc.wantErrors)
			}
			d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
			if slices.Contains(tc.wantKinds, health.SignalTemperature) {
				// 99°C is past the library's default shutdown threshold: data still counts.
				if d.Health != health.Unhealthy {
					t.Errorf("Health = %v, want Unhealthy from the temperature", d.Health)
				}
			} else if d.Health != health.Healthy || d.Unmonitored {
				t.Errorf("Health = %v, unmonitored %v: no data must not be a fault", d.Health, d.Unmonitored)
			}
		})
	}
}

func kindsOf(sigs []health.Signal, uuid string) []health.SignalKind {
	var out []health.SignalKind
	for _, s := range sigs {
		if s.Device == uuid {
			out = append(out, s.Kind)
		}
	}
	return out
}

// teeSink sends everything to two sinks.
type teeSink [2]gpuapi.Sink

func (t teeSink) Signal(s health.Signal) {
	t[0].Signal(s)
	t[1].Signal(s)
}

func (t teeSink) Reboot(bootID string, at time.Time) {
	t[0].Reboot(bootID, at)
	t[1].Reboot(bootID, at)
}

func (t teeSink) SetUnmonitored(uuid string, u bool) {
	t[0].SetUnmonitored(uuid, u)
	t[1].SetUnmonitored(uuid, u)
}

// SetCheckUnmonitored passes the optional capability on to the sinks that have it.
func (t teeSink) SetCheckUnmonitored(uuid string, c health.Check, u bool) {
	for _, s := range t {
		if cs, ok := s.(gpunvml.CheckSink); ok {
			cs.SetCheckUnmonitored(uuid, c, u)
		}
	}
}

func TestCountersBecomeRates(t *testing.T) {
	tests := []struct {
		name   string
		change func(*gpuState)
		want   health.ConditionType
	}{
		{"PCIe replays", func(s *gpuState) { s.replays += 1000 }, health.ConditionPCIeReplayRate},
		{"NVLink errors", func(s *gpuState) { s.linkErrors[1] += 1000 }, health.ConditionNVLinkErrorRate},
		{"NVLink ECC data errors (Hopper)", func(s *gpuState) { s.linkECC[1] += 1000 }, health.ConditionNVLinkErrorRate},
		{"corrected ECC errors", func(s *gpuState) { s.corrected += 100000 }, health.ConditionECCCorrectedStorm},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			// Large totals that do not move are no rate at all.
			f.update(0, func(s *gpuState) { s.replays, s.linkErrors[1], s.corrected = 5000, 5000, 5000000 })
			b := f.open()
			m := newMonitor(t, b)
			f.run(b, m)
			f.step(b)
			if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Healthy {
				t.Fatalf("steady counters: Health = %v %+v, want Healthy", d.Health, d.Conditions)
			}
			f.update(0, tc.change)
			f.step(b)
			d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
			if !slices.ContainsFunc(d.Conditions, func(c health.Condition) bool { return c.Type == tc.want }) {
				t.Errorf("conditions = %+v, want %s", d.Conditions, tc.want)
			}
		})
	}
}

func TestRecoveryActionIsSampled(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	m := newMonitor(t, b)
	f.run(b, m)
	f.update(0, func(s *gpuState) { s.recovery = uint32(health.RecoveryGPUReset) })
	f.step(b)
	d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
	if d.Health != health.Unhealthy || len(d.Conditions) != 1 || d.Conditions[0].Type != health.ConditionRecoveryAction {
		t.Fatalf("Health = %v %+v, want Unhealthy from the recovery action", d.Health, d.Conditions)
	}
	f.update(0, func(s *gpuState) { s.recovery = uint32(health.RecoveryNone) })
	f.step(b)
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Healthy {
		t.Errorf("after the action went back to none: Health = %v %+v, want Healthy", d.Health, d.Conditions)
	}
}

func TestResetDetectedFromECCTotals(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 40, 2 })
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Unhealthy {
		t.Fatalf("uncorrected errors: Health = %v, want Unhealthy", d.Health)
	}
	rec.Take()
	sub := m.Subscribe()
	defer sub.Close()
	sub.Next()

	// The GPU is reset: volatile totals restart.
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 1, 0 })
	f.step(b)

	kinds := kindsOf(rec.Take(), f.uuid(0))
	if len(kinds) < 2 || kinds[0] != health.SignalReset || kinds[1] != health.SignalECCCounters {
		t.Errorf("kinds = %v, want the reset before the ECC totals", kinds)
	}
	if n := b.Stats().Resets; n != 1 {
		t.Errorf("Stats.Resets = %d, want 1", n)
	}
	u, _ := sub.Next()
	if len(u.Transitions) != 1 || u.Transitions[0].To != health.Healthy || u.Transitions[0].Reason != health.ReasonGPUReset {
		t.Errorf("transitions = %+v, want one to Healthy for GPUReset", u.Transitions)
	}
	// Same totals again: no second reset.
	f.step(b)
	if kinds := kindsOf(rec.Take(), f.uuid(0)); slices.Contains(kinds, health.SignalReset) {
		t.Errorf("a second reset was reported: %v", kinds)
	}
}

// Totals that read lower once and then back are a glitch, not a reset: a reset clears faults, so
// one read cannot make it (the simulated driver's readsLower event found the trap).
func TestECCGlitchIsNotAReset(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 40, 2 })
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	rec.Take()
	f.update(0, func(s *gpuState) { s.eccLowReads = 2 }) // one round's corrected and uncorrected read 0
	f.step(b)
	if kinds := kindsOf(rec.Take(), f.uuid(0)); slices.Contains(kinds, health.SignalReset) {
		t.Errorf("a glitch was reported as a reset: %v", kinds)
	}
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(0)); d.Health != health.Unhealthy {
		t.Errorf("after the glitch Health = %v, want the uncorrected errors still Unhealthy", d.Health)
	}
	if st := b.Stats(); st.Glitches != 1 || st.Resets != 0 {
		t.Errorf("Stats: glitches %d, resets %d; want 1, 0", st.Glitches, st.Resets)
	}
}

// Totals that go down but not back to zero (40 -> 39, on both reads) are no reset: no reset
// leaves 39 errors, and taking it for one cleared XID 48. Totals back to zero are an inferred
// reset, which clears the uncorrected-ECC condition but not the XID.
func TestLowerECCTotalsAreCorroborated(t *testing.T) {
	f := newFixture(t)
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 40, 2 })
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	m.Signal(health.XIDSignal(f.uuid(0), 48, time.Now()))
	rec.Take()
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 39, 2 })
	f.step(b)
	if kinds := kindsOf(rec.Take(), f.uuid(0)); slices.Contains(kinds, health.SignalReset) {
		t.Errorf("40 -> 39 was reported as a reset: %v", kinds)
	}
	if st := b.Stats(); st.Glitches != 1 || st.Resets != 0 {
		t.Errorf("Stats: glitches %d, resets %d; want 1, 0", st.Glitches, st.Resets)
	}
	f.update(0, func(s *gpuState) { s.corrected, s.uncorrected = 0, 0 })
	f.step(b)
	var reset *health.Signal
	for _, s := range rec.Take() {
		if s.Device == f.uuid(0) && s.Kind == health.SignalReset {
			reset = &s
		}
	}
	if reset == nil || !reset.Inferred {
		t.Fatalf("totals back to zero: reset signal %+v, want an inferred one", reset)
	}
	d, _ := deviceStatus(m.Snapshot(), f.uuid(0))
	var reasons []string
	for _, c := range d.Conditions {
		reasons = append(reasons, c.Reason)
	}
	if d.Health != health.Unhealthy || !slices.Equal(reasons, []string{"XID48"}) {
		t.Errorf("after the inferred reset: %v %v, want Unhealthy for XID48 alone", d.Health, reasons)
	}
}

// A call that hangs in NVML (a wedged GPU) is reported by Stalled once it has run past three
// sample periods and the margin, and no longer once it returns.
func TestStalledReportsAHungCall(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	f.run(b, &healthtest.Recorder{})
	if err := b.Stalled(f.clock.Now()); err != nil {
		t.Fatalf("Stalled while running well: %v", err)
	}
	hang := make(chan struct{})
	f.update(2, func(s *gpuState) { s.hang = hang })
	f.clock.Step(samplePeriod) // the next round starts and hangs in GPU 2's temperature
	// (The fixture's EventSet.Wait blocks until the test answers it, so only the sampler's
	// stall is looked at here.)
	samplerStalled := func(at time.Time) bool {
		err := b.Stalled(at)
		return err != nil && strings.Contains(err.Error(), "sampling round has been in NVML")
	}
	healthtest.Eventually(t, "the round to start", func() bool { return samplerStalled(f.clock.Now().Add(time.Hour)) })
	if samplerStalled(f.clock.Now()) {
		t.Error("stalled at once; a slow call is no hung one yet")
	}
	if !samplerStalled(f.clock.Now().Add(3*samplePeriod + time.Minute)) {
		t.Errorf("not stalled after the limit: %v", b.Stalled(f.clock.Now().Add(3*samplePeriod+time.Minute)))
	}
	close(hang)
	healthtest.Eventually(t, "the round to end", func() bool { return !samplerStalled(f.clock.Now().Add(time.Hour)) })
}

// A temperature no GPU can have (4,294,967,295 °C, a driver's glitch) is no reading, not a GPU
// at its shutdown temperature.
func TestImplausibleTemperatureIgnored(t *testing.T) {
	f := newFixture(t)
	f.update(1, func(s *gpuState) { s.temperature = math.MaxUint32 })
	b := f.open()
	m := newMonitor(t, b)
	rec := &healthtest.Recorder{}
	f.run(b, teeSink{rec, m})
	if kinds := kindsOf(rec.Take(), f.uuid(1)); slices.Contains(kinds, health.SignalTemperature) {
		t.Errorf("the implausible temperature was passed on: %v", kinds)
	}
	if d, _ := deviceStatus(m.Snapshot(), f.uuid(1)); d.Health != health.Healthy {
		t.Errorf("Health = %v, want Healthy", d.Health)
	}
	r := b.Probe().GPUs[1].Readings
	if r.Temperature != nil || len(r.Errors) != 1 || !strings.Contains(r.Errors[0], "not a plausible GPU temperature") {
		t.Errorf("probe: temperature %+v, errors %v; want no reading and the glitch named", r.Temperature, r.Errors)
	}
}
