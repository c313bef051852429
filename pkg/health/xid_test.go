package health_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// The XID classes of the issue, item 3. Each list is written out here rather than taken from the
// table so that a typo in the table shows up as a failure.
var (
	applicationXIDs = []uint32{13, 31, 43, 45, 68, 69, 94}
	resetClassXIDs  = []uint32{46, 48, 62, 64, 74, 95, 109, 110, 119, 120, 136, 140, 143, 144, 145, 146, 147, 148, 149, 150, 155, 156, 158}
	rebootClassXIDs = []uint32{79, 151, 160}
	// unknownXIDs are not in NVIDIA's catalog as this project knows it.
	unknownXIDs = []uint32{1, 2, 99, 153, 1000, 1 << 20, ^uint32(0)}
	// devicePluginIgnored are the XIDs the NVIDIA device plugin skips.
	devicePluginIgnored = []uint32{13, 31, 43, 45, 68, 109}
)

const forever = 24 * 365 * time.Hour

func TestDefaultPolicyApplicationXIDsAreCountedButChangeNothing(t *testing.T) {
	for _, xid := range applicationXIDs {
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			for i := range 3 {
				if got := h.xid(uuid, xid, time.Duration(i)*time.Second); len(got) != 0 {
					t.Fatalf("XID %d #%d: transitions %+v, want none", xid, i, got)
				}
			}
			h.wantHealth(uuid, health.Healthy, false)
			st := h.status(uuid)
			if len(st.Conditions) != 0 {
				t.Fatalf("conditions %+v, want none", st.Conditions)
			}
			want := []health.XIDCount{{XID: xid, Count: 3, LastSeen: at(2 * time.Second)}}
			if fmt.Sprint(st.XIDs) != fmt.Sprint(want) {
				t.Fatalf("XIDs %+v, want %+v", st.XIDs, want)
			}
		})
	}
}

func TestDefaultPolicyXID63IsDegradedUntilReset(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.xid(uuid, 63, 0), tr(uuid, health.Healthy, health.Degraded, "XID63"))
	c := h.mustCondition(uuid, health.ConditionXID, 63)
	if c.Severity != health.Degraded || c.ClearsOn != health.ClearsOnGPUReset || c.Evict {
		t.Fatalf("condition %+v, want Degraded until gpuReset without eviction", c)
	}
	// Neither time nor samples end it.
	h.signal(health.SignalSample, uuid, forever)
	h.tick(2 * forever)
	h.wantHealth(uuid, health.Degraded, false)
	wantTransitions(t, h.reset(uuid, 2*forever), tr(uuid, health.Degraded, health.Healthy, health.ReasonGPUReset))
	h.wantHealth(uuid, health.Healthy, false)
}

func TestDefaultPolicyXID92IsDegradedUntilQuietPeriod(t *testing.T) {
	p := health.DefaultPolicy()
	quiet := p.QuietPeriod
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.xid(uuid, 92, 0), tr(uuid, health.Healthy, health.Degraded, "XID92"))
	c := h.mustCondition(uuid, health.ConditionXID, 92)
	if c.Severity != health.Degraded || c.ClearsOn != health.ClearsOnQuietPeriod {
		t.Fatalf("condition %+v, want Degraded until quietPeriod", c)
	}
	// A repeat restarts the quiet period.
	h.xid(uuid, 92, quiet/2)
	if got := h.tick(quiet); len(got) != 0 {
		t.Fatalf("tick one quiet period after the first XID 92 but half after the repeat: %+v", got)
	}
	if got := h.tick(quiet/2 + quiet - time.Nanosecond); len(got) != 0 {
		t.Fatalf("tick just before the quiet period ends: %+v", got)
	}
	h.wantHealth(uuid, health.Degraded, false)
	wantTransitions(t, h.tick(quiet/2+quiet), tr(uuid, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
	if _, ok := h.condition(uuid, health.ConditionXID, 92); ok {
		t.Fatal("XID 92 condition still present after its quiet period")
	}
}

func TestDefaultPolicyXID92ExpiresOnTheNextSignalAfterTheQuietPeriod(t *testing.T) {
	// Backends feed samples; they must end quiet periods without anyone calling Tick.
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	h.xid(uuid, 92, 0)
	wantTransitions(t, h.signal(health.SignalSample, uuid, health.DefaultQuietPeriod),
		tr(uuid, health.Degraded, health.Healthy, health.ReasonQuietPeriodElapsed))
}

func TestDefaultPolicyResetClassXIDsAreUnhealthyUntilReset(t *testing.T) {
	for _, xid := range resetClassXIDs {
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			reason := fmt.Sprintf("XID%d", xid)
			wantTransitions(t, h.xid(uuid, xid, 0), tr(uuid, health.Healthy, health.Unhealthy, reason))
			c := h.mustCondition(uuid, health.ConditionXID, xid)
			if c.Severity != health.Unhealthy || c.ClearsOn != health.ClearsOnGPUReset || c.Evict ||
				c.RecommendedAction != health.ActionResetGPU || c.Reason != reason || c.Message == "" || !c.Since.Equal(at(0)) {
				t.Fatalf("condition %+v", c)
			}
			h.signal(health.SignalSample, uuid, forever)
			h.tick(2 * forever)
			h.wantHealth(uuid, health.Unhealthy, false)
			wantTransitions(t, h.reset(uuid, 2*forever), tr(uuid, health.Unhealthy, health.Healthy, health.ReasonGPUReset))
			if st := h.status(uuid); len(st.Conditions) != 0 {
				t.Fatalf("conditions after reset: %+v", st.Conditions)
			}
		})
	}
}

func TestDefaultPolicyRebootClassXIDsEvictUntilNodeReboot(t *testing.T) {
	for _, xid := range rebootClassXIDs {
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			wantTransitions(t, h.xid(uuid, xid, 0), tr(uuid, health.Healthy, health.Unhealthy, fmt.Sprintf("XID%d", xid)))
			c := h.mustCondition(uuid, health.ConditionXID, xid)
			if c.Severity != health.Unhealthy || c.ClearsOn != health.ClearsOnNodeReboot || !c.Evict {
				t.Fatalf("condition %+v, want Unhealthy with eviction until nodeReboot", c)
			}
			// A GPU reset does not bring it back; neither does time.
			if got := h.reset(uuid, time.Minute); len(got) != 0 {
				t.Fatalf("reset: transitions %+v, want none", got)
			}
			h.tick(forever)
			h.wantHealth(uuid, health.Unhealthy, true)
			wantTransitions(t, h.reboot("boot-2", forever), tr(uuid, health.Unhealthy, health.Healthy, health.ReasonNodeReboot))
			h.wantHealth(uuid, health.Healthy, false)
		})
	}
}

func TestDefaultPolicyXID54IsUnhealthy(t *testing.T) {
	h := newHarness(t, health.DefaultPolicy())
	uuid := gpuDevice(0).UUID
	wantTransitions(t, h.xid(uuid, 54, 0), tr(uuid, health.Healthy, health.Unhealthy, "XID54"))
	c := h.mustCondition(uuid, health.ConditionXID, 54)
	if c.RecommendedAction != health.ActionCheckHardware {
		t.Fatalf("recommended action %q, want %q", c.RecommendedAction, health.ActionCheckHardware)
	}
	h.tick(forever)
	h.wantHealth(uuid, health.Unhealthy, false)
}

func TestDefaultPolicyUnknownXIDsFailSafe(t *testing.T) {
	for _, xid := range unknownXIDs {
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			p := health.DefaultPolicy()
			if _, known := p.XIDRuleFor(xid); known {
				t.Fatalf("XID %d is in the table; pick another unknown XID", xid)
			}
			h := newHarness(t, p)
			uuid := gpuDevice(0).UUID
			wantTransitions(t, h.xid(uuid, xid, 0), tr(uuid, health.Healthy, health.Unhealthy, fmt.Sprintf("XID%d", xid)))
			c := h.mustCondition(uuid, health.ConditionXID, xid)
			if c.ClearsOn != health.ClearsOnGPUReset || c.Message == "" {
				t.Fatalf("condition %+v", c)
			}
			if st := h.status(uuid); len(st.XIDs) != 1 || st.XIDs[0].XID != xid || st.XIDs[0].Count != 1 {
				t.Fatalf("XIDs %+v", st.XIDs)
			}
			wantTransitions(t, h.reset(uuid, time.Second), tr(uuid, health.Unhealthy, health.Healthy, health.ReasonGPUReset))
		})
	}
}

func TestDefaultPolicyUnknownXIDRuleIsData(t *testing.T) {
	p := health.DefaultPolicy()
	p.UnknownXID = health.XIDRule{Severity: health.Degraded, ClearsOn: health.ClearsOnQuietPeriod, Action: health.ActionInspect}
	h := newHarness(t, p)
	uuid := gpuDevice(0).UUID
	h.xid(uuid, 999, 0)
	h.wantHealth(uuid, health.Degraded, false)
	h.tick(p.QuietPeriod)
	h.wantHealth(uuid, health.Healthy, false)
}

func TestDefaultPolicyXID154FollowsTheRecoveryAction(t *testing.T) {
	cases := []struct {
		name   string
		action health.RecoveryAction
		want   health.Severity
	}{
		{"none", health.RecoveryNone, health.Healthy},
		{"gpuReset", health.RecoveryGPUReset, health.Unhealthy},
		{"nodeReboot", health.RecoveryNodeReboot, health.Unhealthy},
		{"drainAndReset", health.RecoveryDrainAndReset, health.Unhealthy},
		{"drainP2P", health.RecoveryDrainP2P, health.Degraded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, health.DefaultPolicy())
			uuid := gpuDevice(0).UUID
			if got := h.xid(uuid, 154, 0); len(got) != 0 {
				t.Fatalf("XID 154 alone: transitions %+v, want none", got)
			}
			st := h.status(uuid)
			if len(st.Conditions) != 0 || len(st.XIDs) != 1 || st.XIDs[0].XID != 154 {
				t.Fatalf("after XID 154: conditions %+v xids %+v", st.Conditions, st.XIDs)
			}
			h.signal(health.SignalRecoveryAction, uuid, time.Second, withAction(tc.action))
			h.wantHealth(uuid, tc.want, false)
		})
	}
}

func TestDefaultPolicyTableMatchesTheCatalog(t *testing.T) {
	p := health.DefaultPolicy()
	type want struct {
		sev      health.Severity
		clearsOn health.ClearsOn
		evict    bool
		follow   bool
	}
	expect := map[uint32]want{
		63:  {health.Degraded, health.ClearsOnGPUReset, false, false},
		92:  {health.Degraded, health.ClearsOnQuietPeriod, false, false},
		54:  {health.Unhealthy, health.ClearsOnNodeReboot, false, false},
		154: {health.Healthy, health.ClearsOnGPUReset, false, true},
	}
	for _, x := range applicationXIDs {
		expect[x] = want{sev: health.Healthy, clearsOn: health.ClearsOnGPUReset}
	}
	for _, x := range resetClassXIDs {
		expect[x] = want{sev: health.Unhealthy, clearsOn: health.ClearsOnGPUReset}
	}
	for _, x := range rebootClassXIDs {
		expect[x] = want{sev: health.Unhealthy, clearsOn: health.ClearsOnNodeReboot, evict: true}
	}
	for xid, w := range expect {
		r, known := p.XIDRuleFor(xid)
		if !known {
			t.Errorf("XID %d is missing from the table", xid)
			continue
		}
		if r.Severity != w.sev || r.ClearsOn != w.clearsOn || r.Evict != w.evict || r.FollowRecoveryAction != w.follow || r.Description == "" || r.Action == "" {
			t.Errorf("XID %d: rule %+v, want %+v", xid, r, w)
		}
	}
	for _, xid := range p.SortedXIDs() {
		if _, ok := expect[xid]; !ok {
			t.Errorf("XID %d is in the table but not in the issue's catalog summary", xid)
		}
	}
	if p.UnknownXID.Severity != health.Unhealthy {
		t.Errorf("unknown XID rule %+v, want Unhealthy", p.UnknownXID)
	}
}

func TestDevicePluginProfileIgnoresItsXIDs(t *testing.T) {
	for _, xid := range devicePluginIgnored {
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			h := newHarness(t, health.DevicePluginPolicy())
			uuid := gpuDevice(0).UUID
			if got := h.xid(uuid, xid, 0); len(got) != 0 {
				t.Fatalf("transitions %+v, want none", got)
			}
			h.wantHealth(uuid, health.Healthy, false)
			if st := h.status(uuid); len(st.XIDs) != 1 || st.XIDs[0].Count != 1 {
				t.Fatalf("ignored XID not counted: %+v", st.XIDs)
			}
		})
	}
}

func TestDevicePluginProfileEveryOtherXIDIsUnhealthyForever(t *testing.T) {
	// 69 and 94 are application errors in the catalog, but the device plugin does not skip them.
	xids := []uint32{63, 92, 54, 154, 69, 94}
	xids = append(xids, resetClassXIDs...)
	xids = append(xids, rebootClassXIDs...)
	xids = append(xids, unknownXIDs...)
	for _, xid := range xids {
		if xid == 109 {
			continue // ignored by the device plugin
		}
		t.Run(fmt.Sprintf("XID%d", xid), func(t *testing.T) {
			h := newHarness(t, health.DevicePluginPolicy())
			uuid := gpuDevice(0).UUID
			wantTransitions(t, h.xid(uuid, xid, 0), tr(uuid, health.Healthy, health.Unhealthy, fmt.Sprintf("XID%d", xid)))
			c := h.mustCondition(uuid, health.ConditionXID, xid)
			if c.ClearsOn != health.ClearsOnAdmin || c.Evict {
				t.Fatalf("condition %+v, want Unhealthy until admin, no eviction", c)
			}
			// Nothing but an administrator clears it: not a reset, not a recovery action, not
			// quiet periods, not samples, not a reboot.
			h.reset(uuid, time.Second)
			h.signal(health.SignalRecoveryAction, uuid, 2*time.Second, withAction(health.RecoveryNone))
			h.signal(health.SignalSample, uuid, forever)
			h.tick(2 * forever)
			h.reboot("boot-2", 3*forever)
			h.wantHealth(uuid, health.Unhealthy, false)
			if len(h.all) != 1 {
				t.Fatalf("transitions %+v, want only the first", h.all)
			}
			out, cleared, err := h.tr.ClearCondition(uuid, health.ConditionXID, xid, at(4*forever), nil)
			if err != nil || !cleared {
				t.Fatalf("ClearCondition: cleared %v err %v", cleared, err)
			}
			wantTransitions(t, out, tr(uuid, health.Unhealthy, health.Healthy, health.ReasonAdminCleared))
		})
	}
}

func TestDevicePluginProfileRunsNoPolledCheck(t *testing.T) {
	h := newHarness(t, health.DevicePluginPolicy())
	uuid := gpuDevice(0).UUID
	h.signal(health.SignalECCCounters, uuid, 0, withECC(0, 0))
	h.signal(health.SignalECCCounters, uuid, time.Second, withECC(1e9, 5))
	h.signal(health.SignalECCStorm, uuid, time.Second)
	h.signal(health.SignalRemappedRows, uuid, time.Second, withPending(true), withFailure(true))
	h.signal(health.SignalRetiredPages, uuid, time.Second, withPending(true))
	h.signal(health.SignalTemperature, uuid, time.Second, withValue(150))
	h.signal(health.SignalClockEvents, uuid, time.Second, withReasons(health.ClockEventHWSlowdown|health.ClockEventHWPowerBrake))
	h.signal(health.SignalPCIeReplays, uuid, 0, withValue(0))
	h.signal(health.SignalPCIeReplays, uuid, time.Second, withValue(1e9))
	h.signal(health.SignalNVLinkState, uuid, time.Second, withLink(1), withDown(true))
	h.signal(health.SignalRecoveryAction, uuid, time.Second, withAction(health.RecoveryNodeReboot))
	h.wantHealth(uuid, health.Healthy, false)
	if len(h.all) != 0 {
		t.Fatalf("transitions %+v, want none", h.all)
	}
	// A lost GPU is still reported, and stays reported.
	h.signal(health.SignalLost, uuid, 2*time.Second)
	h.reboot("boot-2", time.Hour)
	h.wantHealth(uuid, health.Unhealthy, false)
}
