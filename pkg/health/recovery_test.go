package health_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func TestRecoveryAction(t *testing.T) {
	cases := []struct {
		action   health.RecoveryAction
		want     health.Severity
		reason   string
		clearsOn health.ClearsOn
		advice   health.Action
	}{
		{health.RecoveryGPUReset, health.Unhealthy, "RecoveryActionGPUReset", health.ClearsOnGPUReset, health.ActionResetGPU},
		{health.RecoveryNodeReboot, health.Unhealthy, "RecoveryActionNodeReboot", health.ClearsOnNodeReboot, health.ActionRebootNode},
		{health.RecoveryDrainAndReset, health.Unhealthy, "RecoveryActionDrainAndReset", health.ClearsOnGPUReset, health.ActionDrainAndResetGPU},
		{health.RecoveryDrainP2P, health.Degraded, "RecoveryActionDrainP2P", health.ClearsOnRecovered, health.ActionDrainP2P},
		{health.RecoveryRecoverIMEXDomain, health.Unhealthy, "RecoveryActionRecoverIMEXDomain", health.ClearsOnNodeReboot, health.ActionRecoverIMEXDomain},
		{health.RecoveryBusReset, health.Unhealthy, "RecoveryActionBusReset", health.ClearsOnGPUReset, health.ActionResetBus},
		{health.RecoverySystemReboot, health.Unhealthy, "RecoveryActionSystemReboot", health.ClearsOnNodeReboot, health.ActionRebootNode},
		// Values newer than this package fail safe: Unhealthy, the value named, only a reboot clears.
		{health.RecoveryAction(9), health.Unhealthy, "RecoveryActionUnknown9", health.ClearsOnNodeReboot, health.ActionInspect},
		{health.RecoveryAction(255), health.Unhealthy, "RecoveryActionUnknown255", health.ClearsOnNodeReboot, health.ActionInspect},
	}
	for _, tc := range cases {
		t.Run(tc.action.String(), func(t *testing.T) {
			t.Run("condition", func(t *testing.T) {
				h := newHarness(t, health.DefaultPolicy())
				uuid := gpuDevice(0).UUID
				h.signal(health.SignalRecoveryAction, uuid, 0, withAction(tc.action))
				c := h.mustCondition(uuid, health.ConditionRecoveryAction, 0)
				if c.Reason != tc.reason || c.ClearsOn != tc.clearsOn || c.RecommendedAction != tc.advice || c.Message == "" {
					t.Errorf("condition %+v, want reason %s, clearsOn %v, action %s and a message", c, tc.reason, tc.clearsOn, tc.advice)
				}
			})
			t.Run("none clears it", func(t *testing.T) {
				h := newHarness(t, health.DefaultPolicy())
				uuid := gpuDevice(0).UUID
				wantTransitions(t, h.signal(health.SignalRecoveryAction, uuid, 0, withAction(tc.action)),
					tr(uuid, health.Healthy, tc.want, tc.reason))
				// The same action again, as every sample repeats it, changes nothing.
				for i := 1; i < 5; i++ {
					if got := h.signal(health.SignalRecoveryAction, uuid, time.Duration(i)*time.Second, withAction(tc.action)); len(got) != 0 {
						t.Fatalf("repeat: %+v", got)
					}
				}
				wantTransitions(t, h.signal(health.SignalRecoveryAction, uuid, 10*time.Second, withAction(health.RecoveryNone)),
					tr(uuid, tc.want, health.Healthy, health.ReasonRecoveryActionNone))
			})
			t.Run("reset", func(t *testing.T) {
				h := newHarness(t, health.DefaultPolicy())
				uuid := gpuDevice(0).UUID
				h.signal(health.SignalRecoveryAction, uuid, 0, withAction(tc.action))
				h.reset(uuid, time.Second)
				want := tc.want
				if tc.clearsOn == health.ClearsOnGPUReset {
					want = health.Healthy
				}
				h.wantHealth(uuid, want, false)
			})
			t.Run("reboot", func(t *testing.T) {
				h := newHarness(t, health.DefaultPolicy())
				uuid := gpuDevice(0).UUID
				h.signal(health.SignalRecoveryAction, uuid, 0, withAction(tc.action))
				h.reboot("boot-2", time.Second)
				h.wantHealth(uuid, health.Healthy, false)
			})
		})
	}
}

// An unknown action that changes to another unknown one is a new condition, not the old one.
func TestRecoveryActionUnknownValuesAreTold(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalRecoveryAction, uuid, 0, withAction(8))
	h.signal(health.SignalRecoveryAction, uuid, time.Second, withAction(9))
	if c := h.mustCondition(uuid, health.ConditionRecoveryAction, 0); c.Reason != "RecoveryActionUnknown9" || !strings.Contains(c.Message, "9") {
		t.Errorf("condition %+v, want the second value named", c)
	}
}

func TestResetRequired(t *testing.T) {
	t.Run("default: Unhealthy until the GPU is reset", func(t *testing.T) {
		h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), migDevice(0, 1, 0))
		uuid := gpuDevice(0).UUID
		wantTransitions(t, h.signal(health.SignalResetRequired, uuid, 0),
			tr(uuid, health.Healthy, health.Unhealthy, "GPUResetRequired"),
			tr(migDevice(0, 1, 0).UUID, health.Healthy, health.Unhealthy, "GPUResetRequired"))
		c := h.mustCondition(uuid, health.ConditionGPUResetRequired, 0)
		if c.ClearsOn != health.ClearsOnGPUReset || c.RecommendedAction != health.ActionResetGPU || c.Evict {
			t.Fatalf("condition %+v", c)
		}
		if got := h.signal(health.SignalResetRequired, uuid, time.Second); len(got) != 0 {
			t.Fatalf("repeat: %+v", got)
		}
		// NVML's recovery action going back to none is another check: it does not clear this.
		h.signal(health.SignalRecoveryAction, uuid, 2*time.Second, withAction(health.RecoveryNone))
		h.wantHealth(uuid, health.Unhealthy, false)
		wantTransitions(t, h.reset(uuid, 3*time.Second),
			tr(uuid, health.Unhealthy, health.Healthy, health.ReasonGPUReset),
			tr(migDevice(0, 1, 0).UUID, health.Unhealthy, health.Healthy, health.ReasonGPUReset))
	})
	t.Run("device-plugin: only an administrator clears it", func(t *testing.T) {
		h := newHarness(t, health.DevicePluginPolicy())
		uuid := gpuDevice(0).UUID
		h.signal(health.SignalResetRequired, uuid, 0)
		h.reset(uuid, time.Second)
		h.reboot("boot-2", 2*time.Second)
		h.wantHealth(uuid, health.Unhealthy, false)
	})
	t.Run("a Healthy rule raises nothing", func(t *testing.T) {
		p := health.DefaultPolicy()
		p.ResetRequired.Severity = health.Healthy
		h := newHarness(t, p)
		h.signal(health.SignalResetRequired, gpuDevice(0).UUID, 0)
		h.wantHealth(gpuDevice(0).UUID, health.Healthy, false)
	})
}

func TestRecoveryActionNoneLeavesOtherConditions(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.xid(uuid, 48, 0)
	h.signal(health.SignalRecoveryAction, uuid, time.Second, withAction(health.RecoveryNone))
	h.wantHealth(uuid, health.Unhealthy, false)
}

func TestRecoveryActionChangesInPlace(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalRecoveryAction, uuid, 0, withAction(health.RecoveryDrainP2P))
	wantTransitions(t, h.signal(health.SignalRecoveryAction, uuid, time.Second, withAction(health.RecoveryNodeReboot)),
		tr(uuid, health.Degraded, health.Unhealthy, "RecoveryActionNodeReboot"))
	if st := h.status(uuid); len(st.Conditions) != 1 {
		t.Fatalf("conditions %+v, want one recovery action", st.Conditions)
	}
	p := health.DefaultPolicy()
	p.RecoveryAction.Enabled = false
	h2 := newHarness(t, p)
	h2.signal(health.SignalRecoveryAction, uuid, 0, withAction(health.RecoveryNodeReboot))
	h2.wantHealth(uuid, health.Healthy, false)
}

// TestInferredResetClearsOnlyWhatTheCountersSaid: a reset the backend only concluded from volatile
// ECC counters that went back to zero clears the uncorrected-ECC condition, never an XID, a lost
// GPU or a reset the driver requires (one lower read once cleared XID 48).
func TestInferredResetClearsOnlyWhatTheCountersSaid(t *testing.T) {
	inferred := func(s *health.Signal) { s.Inferred = true }
	h := newHarness(t, health.DefaultPolicy(), gpuDevice(0), gpuDevice(1), gpuDevice(2), gpuDevice(3))
	ecc, xid, required, lost := gpuDevice(0).UUID, gpuDevice(1).UUID, gpuDevice(2).UUID, gpuDevice(3).UUID
	h.signal(health.SignalECCCounters, ecc, 0, withECC(40, 2))
	h.signal(health.SignalECCCounters, xid, 0, withECC(40, 2))
	h.xid(xid, 48, 0)
	h.signal(health.SignalResetRequired, required, 0)
	h.signal(health.SignalLost, lost, 0)
	for _, uuid := range []string{ecc, xid, required, lost} {
		h.signal(health.SignalReset, uuid, time.Second, inferred)
		h.signal(health.SignalECCCounters, uuid, time.Second, withECC(0, 0))
	}
	h.wantHealth(ecc, health.Healthy, false)
	if _, ok := h.condition(xid, health.ConditionECCUncorrected, 0); ok {
		t.Error("the uncorrected-ECC condition of the XID 48 GPU stayed")
	}
	h.mustCondition(xid, health.ConditionXID, 48)
	h.wantHealth(xid, health.Unhealthy, false)
	h.mustCondition(required, health.ConditionGPUResetRequired, 0)
	h.wantHealth(lost, health.Unhealthy, true)
	// A reset someone reports clears them.
	h.reset(xid, 2*time.Second)
	h.wantHealth(xid, health.Healthy, false)
}

// A recovery action of none comes with every sample; on a GPU with conditions in effect (none
// of them the check's) it must change nothing and allocate nothing.
func TestRecoveryActionNoneBesideOtherConditionsAllocatesNothing(t *testing.T) {
	uuid := gpuDevice(0).UUID
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{gpuDevice(0)})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range []health.Signal{
		health.XIDSignal(uuid, 79, at(0)),
		{Kind: health.SignalTemperature, Device: uuid, Value: 92, SlowdownC: 90, ShutdownC: 95, Time: at(time.Second)},
		{Kind: health.SignalRemappedRows, Device: uuid, Pending: true, Time: at(2 * time.Second)},
	} {
		if _, err := tr.Observe(s, nil); err != nil {
			t.Fatalf("signal %d: %v", i, err)
		}
	}
	before := len(tr.Snapshot().Devices[0].Conditions)
	if before < 2 {
		t.Fatalf("%d conditions in effect, want several", before)
	}
	gen := tr.Generation()
	buf := make([]health.Transition, 0, 4)
	n := 0
	none := func() {
		n++
		s := health.Signal{Kind: health.SignalRecoveryAction, Device: uuid, Action: health.RecoveryNone, Time: at(3*time.Second + time.Duration(n)*time.Millisecond)}
		if out, err := tr.Observe(s, buf[:0]); err != nil || len(out) != 0 {
			t.Fatalf("recovery action none: %v, %v", out, err)
		}
	}
	if allocs := testing.AllocsPerRun(1000, none); allocs != 0 {
		t.Errorf("recovery action none: %v allocations per signal, want 0", allocs)
	}
	if tr.Generation() != gen || len(tr.Snapshot().Devices[0].Conditions) != before {
		t.Errorf("recovery action none changed the conditions: generation %d -> %d", gen, tr.Generation())
	}
}
