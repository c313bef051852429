package health_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// t0 is the start of every test's timeline. Tests advance time explicitly; nothing reads a clock.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// gpuDevice is whole GPU index i.
func gpuDevice(i int) health.Device {
	return health.Device{UUID: fmt.Sprintf("GPU-%04d", i), Index: i, Minor: i, PCIBusID: fmt.Sprintf("0000:%02X:00.0", i), Model: "Test GPU"}
}

// migDevice is a MIG instance (gi, ci) of GPU index parent.
func migDevice(parent int, gi, ci uint32) health.Device {
	return health.Device{
		UUID:  fmt.Sprintf("MIG-%04d-%d-%d", parent, gi, ci),
		Index: parent,
		Minor: parent,
		MIG:   &health.MIGPlacement{ParentUUID: gpuDevice(parent).UUID, GPUInstance: gi, ComputeInstance: ci},
	}
}

// harness drives a Tracker and remembers every transition it reported.
type harness struct {
	t   *testing.T
	tr  *health.Tracker
	all []health.Transition
}

func newHarness(t *testing.T, p *health.Policy, devices ...health.Device) *harness {
	t.Helper()
	if len(devices) == 0 {
		devices = []health.Device{gpuDevice(0)}
	}
	tr, err := health.NewTracker(p, devices)
	if err != nil {
		t.Fatalf("NewTracker: %v", err)
	}
	return &harness{t: t, tr: tr}
}

// observe applies sig and returns the transitions it caused.
func (h *harness) observe(sig health.Signal) []health.Transition {
	h.t.Helper()
	out, err := h.tr.Observe(sig, nil)
	if err != nil {
		h.t.Fatalf("Observe(%v on %s): %v", sig.Kind, sig.Device, err)
	}
	h.all = append(h.all, out...)
	return out
}

func (h *harness) xid(uuid string, xid uint32, d time.Duration) []health.Transition {
	h.t.Helper()
	return h.observe(health.XIDSignal(uuid, xid, at(d)))
}

func (h *harness) signal(kind health.SignalKind, uuid string, d time.Duration, mod ...func(*health.Signal)) []health.Transition {
	h.t.Helper()
	s := health.Signal{Kind: kind, Device: uuid, Time: at(d)}
	for _, m := range mod {
		m(&s)
	}
	return h.observe(s)
}

func (h *harness) reset(uuid string, d time.Duration) []health.Transition {
	h.t.Helper()
	return h.signal(health.SignalReset, uuid, d)
}

func (h *harness) reboot(bootID string, d time.Duration) []health.Transition {
	h.t.Helper()
	out := h.tr.Reboot(bootID, at(d), nil)
	h.all = append(h.all, out...)
	return out
}

func (h *harness) tick(d time.Duration) []health.Transition {
	h.t.Helper()
	out := h.tr.Tick(at(d), nil)
	h.all = append(h.all, out...)
	return out
}

// status returns the current status of the device with uuid.
func (h *harness) status(uuid string) health.DeviceStatus {
	h.t.Helper()
	for _, d := range h.tr.Snapshot().Devices {
		if d.Device.UUID == uuid {
			return d
		}
	}
	h.t.Fatalf("device %s not in snapshot", uuid)
	return health.DeviceStatus{}
}

// wantHealth checks a device's effective health and eviction flag.
func (h *harness) wantHealth(uuid string, want health.Severity, wantEvict bool) {
	h.t.Helper()
	st := h.status(uuid)
	if st.Health != want || st.Evict != wantEvict {
		h.t.Fatalf("%s: health %v evict %v, want %v evict %v (conditions %+v)", uuid, st.Health, st.Evict, want, wantEvict, st.Conditions)
	}
}

// condition returns the device's condition of type typ (and code), if any.
func (h *harness) condition(uuid string, typ health.ConditionType, code uint32) (health.Condition, bool) {
	h.t.Helper()
	st := h.status(uuid)
	i := slices.IndexFunc(st.Conditions, func(c health.Condition) bool { return c.Type == typ && c.Code == code })
	if i < 0 {
		return health.Condition{}, false
	}
	return st.Conditions[i], true
}

func (h *harness) mustCondition(uuid string, typ health.ConditionType, code uint32) health.Condition {
	h.t.Helper()
	c, ok := h.condition(uuid, typ, code)
	if !ok {
		h.t.Fatalf("%s: no %s/%d condition; have %+v", uuid, typ, code, h.status(uuid).Conditions)
	}
	return c
}

// wantTransitions compares transitions by device, from, to and reason.
func wantTransitions(t *testing.T, got []health.Transition, want ...string) {
	t.Helper()
	var g []string
	for _, tr := range got {
		g = append(g, fmt.Sprintf("%s %v->%v %s", tr.Device.UUID, tr.From, tr.To, tr.Reason))
	}
	if !slices.Equal(g, want) {
		t.Fatalf("transitions:\n got %q\nwant %q", g, want)
	}
}

func tr(uuid string, from, to health.Severity, reason string) string {
	return fmt.Sprintf("%s %v->%v %s", uuid, from, to, reason)
}

// Signal modifiers.
func withValue(v int64) func(*health.Signal)  { return func(s *health.Signal) { s.Value = v } }
func withLink(l uint32) func(*health.Signal)  { return func(s *health.Signal) { s.Link = l } }
func withDown(d bool) func(*health.Signal)    { return func(s *health.Signal) { s.Down = d } }
func withPending(p bool) func(*health.Signal) { return func(s *health.Signal) { s.Pending = p } }
func withFailure(f bool) func(*health.Signal) { return func(s *health.Signal) { s.Failure = f } }
func withAction(a health.RecoveryAction) func(*health.Signal) {
	return func(s *health.Signal) { s.Action = a }
}
func withReasons(r health.ClockEventReasons) func(*health.Signal) {
	return func(s *health.Signal) { s.Reasons = r }
}
func withECC(corrected, uncorrected uint64) func(*health.Signal) {
	return func(s *health.Signal) { s.Corrected, s.Uncorrected = corrected, uncorrected }
}
func withThresholds(slowdown, shutdown int64) func(*health.Signal) {
	return func(s *health.Signal) { s.SlowdownC, s.ShutdownC = slowdown, shutdown }
}
func withScope(gi, ci uint32) func(*health.Signal) {
	return func(s *health.Signal) { s.MIGScoped, s.GPUInstance, s.ComputeInstance = true, gi, ci }
}
func withXID(x uint32) func(*health.Signal) { return func(s *health.Signal) { s.XID = x } }
