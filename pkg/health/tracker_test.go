package health_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestNewTrackerRejectsBadInventories(t *testing.T) {
	orphan := migDevice(5, 1, 0)
	nested := migDevice(0, 2, 0)
	nested.MIG.ParentUUID = migDevice(0, 1, 0).UUID
	cases := []struct {
		name    string
		policy  *health.Policy
		devices []health.Device
	}{
		{"nil policy", nil, []health.Device{gpuDevice(0)}},
		{"device without UUID", health.DefaultPolicy(), []health.Device{{Index: 3}}},
		{"duplicate UUID", health.DefaultPolicy(), []health.Device{gpuDevice(0), gpuDevice(0)}},
		{"MIG instance of an unknown GPU", health.DefaultPolicy(), []health.Device{gpuDevice(0), orphan}},
		{"MIG instance of a MIG instance", health.DefaultPolicy(), []health.Device{gpuDevice(0), migDevice(0, 1, 0), nested}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := health.NewTracker(tc.policy, tc.devices); err == nil {
				t.Fatal("NewTracker accepted a bad inventory")
			}
		})
	}
}

func TestSnapshotOrdersDevicesByIndexThenMIG(t *testing.T) {
	devs := []health.Device{migDevice(1, 2, 0), gpuDevice(2), migDevice(1, 1, 0), gpuDevice(1), gpuDevice(0)}
	h := newHarness(t, health.DefaultPolicy(), devs...)
	var got []string
	for _, d := range h.tr.Snapshot().Devices {
		got = append(got, d.Device.UUID)
	}
	want := []string{gpuDevice(0).UUID, gpuDevice(1).UUID, migDevice(1, 1, 0).UUID, migDevice(1, 2, 0).UUID, gpuDevice(2).UUID}
	if len(got) != len(want) {
		t.Fatalf("snapshot %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("snapshot %v, want %v", got, want)
		}
	}
}

func TestTransitionsOnlyWhenEffectiveHealthChanges(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0))
	uuid := gpuDevice(0).UUID
	steps := []struct {
		name string
		do   func() []health.Transition
		want []string
	}{
		{"degraded by XID 63", func() []health.Transition { return h.xid(uuid, 63, 0) },
			[]string{tr(uuid, health.Healthy, health.Degraded, "XID63")}},
		{"a second Degraded condition", func() []health.Transition {
			return h.signal(health.SignalClockEvents, uuid, time.Second, withReasons(health.ClockEventHWSlowdown))
		}, nil},
		{"worse: Unhealthy", func() []health.Transition { return h.xid(uuid, 48, 2*time.Second) },
			[]string{tr(uuid, health.Degraded, health.Unhealthy, "XID48")}},
		{"another Unhealthy condition", func() []health.Transition { return h.xid(uuid, 62, 3*time.Second) }, nil},
		{"the same XID again", func() []health.Transition { return h.xid(uuid, 48, 4*time.Second) }, nil},
		{"eviction added, health unchanged", func() []health.Transition { return h.xid(uuid, 79, 5*time.Second) }, nil},
		{"reset clears 48, 62 and 63, 79 holds", func() []health.Transition { return h.reset(uuid, 6*time.Second) }, nil},
		{"reboot clears the rest", func() []health.Transition { return h.reboot("b2", 7*time.Second) },
			[]string{tr(uuid, health.Unhealthy, health.Healthy, health.ReasonNodeReboot)}},
	}
	for _, s := range steps {
		got := s.do()
		if len(got) != len(s.want) {
			t.Fatalf("%s: transitions %+v, want %q", s.name, got, s.want)
		}
		wantTransitions(t, got, s.want...)
	}
	if got := h.tr.Snapshot().Devices[0]; got.Health != health.Healthy || len(got.Conditions) != 0 {
		t.Fatalf("final state %+v", got)
	}
}

func TestTransitionReasonIsTheWorstConditionAndItsTime(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalClockEvents, uuid, 0, withReasons(health.ClockEventHWSlowdown))
	h.xid(uuid, 48, time.Second)
	got := h.xid(uuid, 79, 2*time.Second) // no change: already Unhealthy
	if len(got) != 0 {
		t.Fatalf("%+v", got)
	}
	got = h.reset(uuid, 3*time.Second) // 48 clears, 79 holds: still Unhealthy
	if len(got) != 0 {
		t.Fatalf("%+v", got)
	}
	got = h.reboot("b2", 4*time.Second)
	wantTransitions(t, got, tr(uuid, health.Unhealthy, health.Healthy, health.ReasonNodeReboot))
	if !got[0].Time.Equal(at(4*time.Second)) || got[0].Device.UUID != uuid || got[0].Device.Index != 0 {
		t.Fatalf("transition %+v", got[0])
	}
}

func TestStormOfIdenticalSignalsMakesOneTransition(t *testing.T) {
	cases := []struct {
		name string
		sig  func(i int) health.Signal
	}{
		{"XID 48", func(i int) health.Signal { return health.XIDSignal(gpuDevice(0).UUID, 48, at(time.Duration(i))) }},
		{"XID 79", func(i int) health.Signal { return health.XIDSignal(gpuDevice(0).UUID, 79, at(0)) }},
		{"XID 92", func(i int) health.Signal {
			return health.XIDSignal(gpuDevice(0).UUID, 92, at(time.Duration(i)*time.Millisecond))
		}},
		{"lost", func(i int) health.Signal {
			return health.Signal{Kind: health.SignalLost, Device: gpuDevice(0).UUID, Time: at(time.Duration(i))}
		}},
		{"temperature", func(i int) health.Signal {
			return health.Signal{Kind: health.SignalTemperature, Device: gpuDevice(0).UUID, Time: at(time.Duration(i) * time.Second), Value: 99}
		}},
		{"ECC storm event", func(i int) health.Signal {
			return health.Signal{Kind: health.SignalECCStorm, Device: gpuDevice(0).UUID, Time: at(time.Duration(i))}
		}},
		{"MIG-scoped XID", func(i int) health.Signal {
			s := health.XIDSignal(gpuDevice(0).UUID, 62, at(time.Duration(i)))
			withScope(1, health.NoInstance)(&s)
			return s
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy(), gpuDevice(0))
			if tc.name == "MIG-scoped XID" {
				h = newHarness(t, health.DefaultPolicy(), gpuDevice(0), migDevice(0, 1, 0))
			}
			gen := h.tr.Generation()
			for i := range 10_000 {
				h.observe(tc.sig(i))
				if i == 0 {
					gen = h.tr.Generation()
				}
			}
			if len(h.all) != 1 {
				t.Fatalf("%d transitions, want exactly one: %+v", len(h.all), h.all)
			}
			if h.tr.Generation() != gen {
				t.Fatalf("generation moved from %d to %d during the storm", gen, h.tr.Generation())
			}
		})
	}
}

func TestStormCountsEveryXID(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	for i := range 10_000 {
		h.xid(uuid, 31, time.Duration(i)*time.Millisecond)
	}
	st := h.status(uuid)
	if len(st.XIDs) != 1 || st.XIDs[0].Count != 10_000 || !st.XIDs[0].LastSeen.Equal(at(9999*time.Millisecond)) {
		t.Fatalf("XIDs %+v", st.XIDs)
	}
	if len(h.all) != 0 {
		t.Fatalf("transitions %+v", h.all)
	}
}

func TestGeneration(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	g0 := h.tr.Generation()
	h.xid(uuid, 13, 0)
	if g := h.tr.Generation(); g != g0 {
		// Application XIDs change no condition.
		t.Fatalf("generation %d after an application XID, want %d", g, g0)
	}
	h.xid(uuid, 48, time.Second)
	g1 := h.tr.Generation()
	if g1 == g0 {
		t.Fatal("generation did not change when a condition appeared")
	}
	for i := range 100 {
		h.xid(uuid, 48, time.Duration(2+i)*time.Second)
	}
	if g := h.tr.Generation(); g != g1 {
		t.Fatalf("generation moved from %d to %d on repeated identical signals", g1, g)
	}
	// A change that does not change health still changes the generation.
	h.xid(uuid, 79, time.Hour)
	g2 := h.tr.Generation()
	if g2 == g1 {
		t.Fatal("generation did not change when eviction was added")
	}
	if err := h.tr.SetUnmonitored(uuid, true); err != nil {
		t.Fatal(err)
	}
	g3 := h.tr.Generation()
	if g3 == g2 || !h.status(uuid).Unmonitored {
		t.Fatalf("SetUnmonitored: generation %d (was %d), unmonitored %v", g3, g2, h.status(uuid).Unmonitored)
	}
	if err := h.tr.SetUnmonitored(uuid, true); err != nil || h.tr.Generation() != g3 {
		t.Fatalf("SetUnmonitored again: err %v, generation %d want %d", err, h.tr.Generation(), g3)
	}
	h.wantHealth(uuid, health.Unhealthy, true)
	h.reset(uuid, 2*time.Hour)
	if h.tr.Generation() == g3 {
		t.Fatal("generation did not change when a reset cleared a condition")
	}
}

func TestUnknownDevice(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	before := h.tr.Generation()
	if _, err := h.tr.Observe(health.XIDSignal("GPU-nope", 48, at(0)), nil); !errors.Is(err, health.ErrUnknownDevice) {
		t.Fatalf("Observe: err %v, want ErrUnknownDevice", err)
	}
	if _, _, err := h.tr.ClearCondition("GPU-nope", "", 0, at(0), nil); !errors.Is(err, health.ErrUnknownDevice) {
		t.Fatalf("ClearCondition: err %v, want ErrUnknownDevice", err)
	}
	if err := h.tr.SetUnmonitored("GPU-nope", true); !errors.Is(err, health.ErrUnknownDevice) {
		t.Fatalf("SetUnmonitored: err %v, want ErrUnknownDevice", err)
	}
	if h.tr.Generation() != before || len(h.tr.Snapshot().Devices) != 1 {
		t.Fatal("a signal about an unknown device changed the tracker")
	}
}

func TestClearCondition(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.xid(uuid, 79, 0)
	h.xid(uuid, 63, 0)
	t.Run("nothing matches", func(t *testing.T) {
		out, cleared, err := h.tr.ClearCondition(uuid, health.ConditionXID, 48, at(time.Second), nil)
		if err != nil || cleared || len(out) != 0 {
			t.Fatalf("cleared %v err %v out %+v", cleared, err, out)
		}
	})
	t.Run("one condition", func(t *testing.T) {
		out, cleared, err := h.tr.ClearCondition(uuid, health.ConditionXID, 79, at(2*time.Second), nil)
		if err != nil || !cleared {
			t.Fatalf("cleared %v err %v", cleared, err)
		}
		wantTransitions(t, out, tr(uuid, health.Unhealthy, health.Degraded, health.ReasonAdminCleared))
		h.wantHealth(uuid, health.Degraded, false)
	})
	t.Run("every condition", func(t *testing.T) {
		h.xid(uuid, 48, 3*time.Second)
		out, cleared, err := h.tr.ClearCondition(uuid, "", 0, at(4*time.Second), nil)
		if err != nil || !cleared {
			t.Fatalf("cleared %v err %v", cleared, err)
		}
		wantTransitions(t, out, tr(uuid, health.Unhealthy, health.Healthy, health.ReasonAdminCleared))
		if st := h.status(uuid); len(st.Conditions) != 0 {
			t.Fatalf("conditions %+v", st.Conditions)
		}
	})
}

func TestTickExpiresQuietPeriodsOnEveryDevice(t *testing.T) {
	p := health.DefaultPolicy()
	p.QuietPeriod = time.Minute
	h := newHarness(t, p, gpuDevice(0), gpuDevice(1), gpuDevice(2))
	h.xid(gpuDevice(0).UUID, 92, 0)
	h.signal(health.SignalECCStorm, gpuDevice(1).UUID, 30*time.Second)
	h.xid(gpuDevice(2).UUID, 48, 0)
	if got := h.tick(59 * time.Second); len(got) != 0 {
		t.Fatalf("early tick: %+v", got)
	}
	wantTransitions(t, h.tick(time.Minute), tr(gpuDevice(0).UUID, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
	wantTransitions(t, h.tick(90*time.Second), tr(gpuDevice(1).UUID, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
	if got := h.tick(forever); len(got) != 0 {
		t.Fatalf("tick cleared something that does not clear on a quiet period: %+v", got)
	}
	h.wantHealth(gpuDevice(2).UUID, health.Unhealthy, false)
	if s := h.tr.Snapshot(); !s.Time.Equal(at(forever)) {
		t.Fatalf("snapshot time %v, want the last tick", s.Time)
	}
}

func TestOutOfOrderSignalsDoNotMoveTimeBackwards(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.xid(uuid, 13, time.Hour)
	h.xid(uuid, 13, time.Minute)
	if s := h.tr.Snapshot(); !s.Time.Equal(at(time.Hour)) {
		t.Fatalf("snapshot time %v, want %v", s.Time, at(time.Hour))
	}
}

func TestObserveAppendsToTheCallersSlice(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), gpuDevice(1))
	buf := make([]health.Transition, 0, 8)
	buf, err := h.tr.Observe(health.XIDSignal(gpuDevice(0).UUID, 48, at(0)), buf)
	if err != nil {
		t.Fatal(err)
	}
	buf, err = h.tr.Observe(health.XIDSignal(gpuDevice(1).UUID, 48, at(0)), buf)
	if err != nil {
		t.Fatal(err)
	}
	wantTransitions(t, buf,
		tr(gpuDevice(0).UUID, health.Healthy, health.Unhealthy, "XID48"),
		tr(gpuDevice(1).UUID, health.Healthy, health.Unhealthy, "XID48"))
}

func TestSnapshotIsADeepCopy(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), migDevice(0, 1, 0))
	h.xid(gpuDevice(0).UUID, 48, 0)
	h.xid(gpuDevice(0).UUID, 13, 0)
	s := h.tr.Snapshot()
	s.Devices[0].Conditions[0].Reason = "changed"
	s.Devices[0].XIDs[0].Count = 99
	s.Devices[1].Device.MIG.GPUInstance = 42
	again := h.tr.Snapshot()
	if again.Devices[0].Conditions[0].Reason != "XID48" || again.Devices[0].XIDs[0].Count != 1 || again.Devices[1].Device.MIG.GPUInstance != 1 {
		t.Fatalf("snapshot shares memory with the tracker: %+v", again.Devices)
	}
}

// MIG scoping (issue item 4).

func migHarness(t *testing.T, p *health.Policy) *harness {
	return newHarness(t, p, gpuDevice(0), migDevice(0, 1, 0), migDevice(0, 2, 0), migDevice(0, 2, 1), gpuDevice(1))
}

func TestMIGFaultOnTheParentAppliesToEveryInstance(t *testing.T) {
	cases := []struct {
		name string
		sig  health.Signal
		want health.Severity
	}{
		{"XID", health.XIDSignal(gpuDevice(0).UUID, 48, at(0)), health.Unhealthy},
		{"lost", health.Signal{Kind: health.SignalLost, Device: gpuDevice(0).UUID, Time: at(0)}, health.Unhealthy},
		{"temperature", health.Signal{Kind: health.SignalTemperature, Device: gpuDevice(0).UUID, Time: at(0), Value: 91}, health.Degraded},
		{"uncorrected ECC", health.Signal{Kind: health.SignalECCCounters, Device: gpuDevice(0).UUID, Time: at(0), Uncorrected: 1}, health.Unhealthy},
		{"polled reading reported on an instance", health.Signal{Kind: health.SignalTemperature, Device: migDevice(0, 2, 0).UUID, Time: at(0), Value: 99}, health.Unhealthy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := migHarness(t, health.DefaultPolicy())
			got := h.observe(tc.sig)
			evict := tc.name == "lost"
			for _, d := range []health.Device{gpuDevice(0), migDevice(0, 1, 0), migDevice(0, 2, 0), migDevice(0, 2, 1)} {
				h.wantHealth(d.UUID, tc.want, evict)
				if len(h.status(d.UUID).Conditions) != 1 {
					t.Fatalf("%s: conditions %+v, want the parent's one", d.UUID, h.status(d.UUID).Conditions)
				}
			}
			h.wantHealth(gpuDevice(1).UUID, health.Healthy, false)
			if len(got) != 4 {
				t.Fatalf("transitions %+v, want one per GPU and instance", got)
			}
			// Every instance inherits the condition, but it belongs to the GPU: the GPU's own
			// snapshot entry lists it first.
			if s := h.tr.Snapshot(); s.Devices[0].Conditions[0].Type == "" {
				t.Fatal("missing condition")
			}
		})
	}
}

func TestMIGScopedXIDStaysInItsInstance(t *testing.T) {
	cases := []struct {
		name      string
		gi, ci    uint32
		unhealthy []health.Device
	}{
		{"GPU instance 1", 1, health.NoInstance, []health.Device{migDevice(0, 1, 0)}},
		{"GPU instance 2, every compute instance", 2, health.NoInstance, []health.Device{migDevice(0, 2, 0), migDevice(0, 2, 1)}},
		{"GPU instance 2, compute instance 1", 2, 1, []health.Device{migDevice(0, 2, 1)}},
		{"unknown GPU instance falls back to the whole GPU", 7, health.NoInstance,
			[]health.Device{gpuDevice(0), migDevice(0, 1, 0), migDevice(0, 2, 0), migDevice(0, 2, 1)}},
		{"unknown compute instance falls back to the whole GPU", 1, 5,
			[]health.Device{gpuDevice(0), migDevice(0, 1, 0), migDevice(0, 2, 0), migDevice(0, 2, 1)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := migHarness(t, health.DefaultPolicy())
			got := h.observe(health.Signal{Kind: health.SignalXID, Device: gpuDevice(0).UUID, Time: at(0), XID: 62,
				MIGScoped: true, GPUInstance: tc.gi, ComputeInstance: tc.ci})
			if len(got) != len(tc.unhealthy) {
				t.Fatalf("transitions %+v, want %d", got, len(tc.unhealthy))
			}
			sick := map[string]bool{}
			for _, d := range tc.unhealthy {
				sick[d.UUID] = true
			}
			for _, d := range h.tr.Snapshot().Devices {
				want := health.Healthy
				if sick[d.Device.UUID] {
					want = health.Unhealthy
				}
				if d.Health != want {
					t.Errorf("%s: %v, want %v", d.Device.UUID, d.Health, want)
				}
			}
		})
	}
}

func TestMIGXIDCountsBelongToTheInstance(t *testing.T) {
	h := migHarness(t, health.DefaultPolicy())
	h.signal(health.SignalXID, gpuDevice(0).UUID, 0, withXID(43), withScope(1, health.NoInstance))
	if st := h.status(migDevice(0, 1, 0).UUID); len(st.XIDs) != 1 || st.XIDs[0].XID != 43 {
		t.Fatalf("instance XIDs %+v", st.XIDs)
	}
	if st := h.status(gpuDevice(0).UUID); len(st.XIDs) != 0 {
		t.Fatalf("parent XIDs %+v", st.XIDs)
	}
	// An XID reported on the instance's own UUID concerns that instance.
	h.xid(migDevice(0, 2, 1).UUID, 48, time.Second)
	h.wantHealth(migDevice(0, 2, 1).UUID, health.Unhealthy, false)
	h.wantHealth(migDevice(0, 2, 0).UUID, health.Healthy, false)
	h.wantHealth(gpuDevice(0).UUID, health.Healthy, false)
}

func TestMIGResetOfTheGPUClearsItsInstances(t *testing.T) {
	h := migHarness(t, health.DefaultPolicy())
	h.signal(health.SignalXID, gpuDevice(0).UUID, 0, withXID(62), withScope(2, health.NoInstance))
	h.xid(gpuDevice(0).UUID, 63, 0)
	// A reset reported on one instance resets the physical GPU.
	h.reset(migDevice(0, 1, 0).UUID, time.Second)
	for _, d := range h.tr.Snapshot().Devices {
		if d.Health != health.Healthy {
			t.Errorf("%s still %v after the reset: %+v", d.Device.UUID, d.Health, d.Conditions)
		}
	}
}

func TestMIGInstanceClearsWhileTheParentHoldsAFault(t *testing.T) {
	h := migHarness(t, health.DefaultPolicy())
	gpu, mig := gpuDevice(0).UUID, migDevice(0, 1, 0).UUID
	h.signal(health.SignalXID, gpu, 0, withXID(48), withScope(1, health.NoInstance))
	h.signal(health.SignalTemperature, gpu, 0, withValue(91))
	h.wantHealth(mig, health.Unhealthy, false)
	h.wantHealth(gpu, health.Degraded, false)
	out, _, err := h.tr.ClearCondition(mig, health.ConditionXID, 48, at(time.Second), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantTransitions(t, out, tr(mig, health.Unhealthy, health.Degraded, health.ReasonAdminCleared))
}

func TestMIGQuietPeriodEndsWithTheGPUsSamples(t *testing.T) {
	// Backends sample the physical GPU, never an instance; a quiet-period condition on an
	// instance must still end when the GPU's next sample comes after the quiet period.
	p := health.DefaultPolicy()
	p.QuietPeriod = time.Minute
	h := migHarness(t, p)
	gpu, mig := gpuDevice(0).UUID, migDevice(0, 1, 0).UUID
	h.signal(health.SignalXID, gpu, 0, withXID(92), withScope(1, health.NoInstance))
	h.wantHealth(mig, health.Degraded, false)
	if got := h.signal(health.SignalSample, gpu, 50*time.Second); len(got) != 0 {
		t.Fatalf("sample before the quiet period: %+v", got)
	}
	wantTransitions(t, h.signal(health.SignalSample, gpu, time.Minute),
		tr(mig, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
}

func TestRebootKeepsAdminConditionsAndDropsTheRest(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), gpuDevice(1))
	a, b := gpuDevice(0).UUID, gpuDevice(1).UUID
	p := health.DevicePluginPolicy()
	hp := newHarness(t, p)
	hp.xid(a, 48, 0)
	h.xid(a, 79, 0)
	h.xid(b, 92, 0)
	h.signal(health.SignalTemperature, b, 0, withValue(99))
	h.signal(health.SignalPCIeReplays, b, 0, withValue(0))
	h.reboot("boot-2", time.Second)
	for _, d := range h.tr.Snapshot().Devices {
		if d.Health != health.Healthy {
			t.Errorf("%s after reboot: %+v", d.Device.UUID, d.Conditions)
		}
	}
	if s := h.tr.Snapshot(); s.BootID != "boot-2" {
		t.Fatalf("boot ID %q after reboot", s.BootID)
	}
	// Counter baselines are gone too: the first reading after the reboot is not compared with the
	// last one before it.
	h.signal(health.SignalPCIeReplays, b, 2*time.Second, withValue(1_000_000))
	h.wantHealth(b, health.Healthy, false)
	hp.reboot("boot-2", time.Second)
	hp.wantHealth(a, health.Unhealthy, false)
}

func TestPolicyCloneIsDeep(t *testing.T) {
	p := health.DefaultPolicy()
	c := p.Clone()
	c.XIDs[48] = health.XIDRule{Severity: health.Healthy}
	c.Thermal.SlowdownC = 1
	if r, _ := p.XIDRuleFor(48); r.Severity != health.Unhealthy || p.Thermal.SlowdownC != 0 {
		t.Fatal("Clone shares state with the original")
	}
}

func TestPolicyForProfile(t *testing.T) {
	for _, name := range append(health.Profiles(), "") {
		t.Run(name, func(t *testing.T) {
			p, err := health.PolicyForProfile(name)
			if err != nil || p == nil {
				t.Fatalf("PolicyForProfile(%q): %v", name, err)
			}
			want := name
			if want == "" {
				want = "default"
			}
			if p.Name != want {
				t.Fatalf("name %q, want %q", p.Name, want)
			}
		})
	}
	if _, err := health.PolicyForProfile("strict"); err == nil {
		t.Fatal("unknown profile accepted")
	}
}

func TestSetCheckUnmonitored(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), migDevice(0, 1, 0))
	uuid := gpuDevice(0).UUID
	gen := h.tr.Generation()
	for _, c := range []health.Check{health.CheckECC, health.CheckClockEvents, health.CheckECC} {
		if err := h.tr.SetCheckUnmonitored(uuid, c, true); err != nil {
			t.Fatal(err)
		}
	}
	st := h.status(uuid)
	if !slices.Equal(st.UnmonitoredChecks, []health.Check{health.CheckClockEvents, health.CheckECC}) {
		t.Errorf("UnmonitoredChecks = %v, want clockEvents and ecc, sorted, once each", st.UnmonitoredChecks)
	}
	if st.Health != health.Healthy || st.Unmonitored {
		t.Errorf("a check that cannot run changed the device: %+v", st)
	}
	if got := h.tr.Generation(); got != gen+2 {
		t.Errorf("generation moved by %d, want 2 (the repeat changes nothing)", got-gen)
	}
	if len(h.status(migDevice(0, 1, 0).UUID).UnmonitoredChecks) != 0 {
		t.Error("the mark reached a MIG device it was not set on")
	}
	if err := h.tr.SetCheckUnmonitored(uuid, health.CheckECC, false); err != nil {
		t.Fatal(err)
	}
	if st := h.status(uuid); !slices.Equal(st.UnmonitoredChecks, []health.Check{health.CheckClockEvents}) {
		t.Errorf("after clearing ecc: %v", st.UnmonitoredChecks)
	}
	if err := h.tr.SetCheckUnmonitored("GPU-nope", health.CheckECC, true); !errors.Is(err, health.ErrUnknownDevice) {
		t.Errorf("unknown device: %v", err)
	}
}
