package health

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrUnknownDevice is returned for a signal about a device the Tracker does not know.
var ErrUnknownDevice = errors.New("unknown device")

// Reasons a Transition gives when a device becomes healthier.
const (
	ReasonGPUReset           = "GPUReset"
	ReasonNodeReboot         = "NodeReboot"
	ReasonRecovered          = "Recovered"
	ReasonQuietPeriodElapsed = "QuietPeriodElapsed"
	ReasonAdminCleared       = "AdminCleared"
	ReasonRecoveryActionNone = "RecoveryActionNone"
)

// Tracker holds the health state of a set of devices and applies signals to it under a Policy.
// It is safe for concurrent use; Observe is designed to be called from one feeding goroutine at
// a high rate while others take snapshots.
type Tracker struct {
	mu      sync.Mutex
	policy  *Policy
	bootID  string
	devices map[string]*deviceState
	// ordered lists every device in snapshot order: by index, each GPU before its MIG instances.
	ordered []*deviceState
	// generation increases whenever any device's conditions change in any way.
	generation uint64
	lastTime   time.Time
}

// condState is a condition plus the hysteresis memory of the check that owns it.
type condState struct {
	Condition
	// cleanSamples counts consecutive samples whose reading called for less than the current
	// severity; cleanAt is the time of the last one counted, so that several readings at one
	// instant count once.
	cleanSamples int
	cleanAt      time.Time
}

// counterRate turns samples of a monotonically increasing counter into a per-minute rate.
type counterRate struct {
	base  int64
	at    time.Time
	valid bool
}

// perMinute records a sample and returns the rate since the previous one. It reports no rate
// for the first sample, after the counter went backwards (a reset), after the clock went
// backwards (a new baseline: no rate is known across a clock step), and while time has not
// advanced (the increase then counts towards the next rate).
func (r *counterRate) perMinute(v int64, now time.Time) (float64, bool) {
	if !r.valid || v < r.base || now.Before(r.at) {
		*r = counterRate{base: v, at: now, valid: true}
		return 0, false
	}
	elapsed := now.Sub(r.at)
	if elapsed <= 0 {
		return 0, false
	}
	rate := float64(v-r.base) / elapsed.Minutes()
	r.base, r.at = v, now
	return rate, true
}

const maxTrackedLinks = 64

type deviceState struct {
	dev      Device
	parent   *deviceState
	children []*deviceState

	conds []condState
	// own is the worst severity of the device's own conditions; health and evict are effective
	// values that include the parent's conditions.
	own, health Severity
	ownEvict    bool
	evict       bool
	xids        []XIDCount
	unmonitored bool

	eccCorrected counterRate
	pcie         counterRate
	nvlink       []counterRate
}

// NewTracker returns a Tracker for devices under policy. MIG instances name their parent in
// Device.MIG; the parent must be in devices too.
func NewTracker(policy *Policy, devices []Device) (*Tracker, error) {
	if policy == nil {
		return nil, errors.New("nil policy")
	}
	t := &Tracker{policy: policy, devices: make(map[string]*deviceState, len(devices))}
	for _, d := range devices {
		if err := t.addLocked(d); err != nil {
			return nil, err
		}
	}
	if err := t.linkLocked(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Tracker) addLocked(d Device) error {
	if d.UUID == "" {
		return fmt.Errorf("device with index %d has no UUID", d.Index)
	}
	if _, dup := t.devices[d.UUID]; dup {
		return fmt.Errorf("duplicate device UUID %q", d.UUID)
	}
	ds := &deviceState{dev: d}
	t.devices[d.UUID] = ds
	t.ordered = append(t.ordered, ds)
	return nil
}

// linkLocked connects MIG instances to their parents and orders the devices for snapshots.
func (t *Tracker) linkLocked() error {
	for _, ds := range t.ordered {
		ds.parent, ds.children = nil, nil
	}
	for _, ds := range t.ordered {
		if ds.dev.MIG == nil {
			continue
		}
		p, ok := t.devices[ds.dev.MIG.ParentUUID]
		if !ok {
			return fmt.Errorf("MIG device %q names unknown parent %q", ds.dev.UUID, ds.dev.MIG.ParentUUID)
		}
		if p.dev.MIG != nil {
			return fmt.Errorf("MIG device %q names another MIG device %q as parent", ds.dev.UUID, p.dev.UUID)
		}
		ds.parent = p
		p.children = append(p.children, ds)
	}
	slices.SortStableFunc(t.ordered, func(a, b *deviceState) int {
		ka, kb := a.sortKey(), b.sortKey()
		return cmp.Or(cmp.Compare(ka.index, kb.index), cmp.Compare(ka.mig, kb.mig),
			cmp.Compare(ka.gi, kb.gi), cmp.Compare(ka.ci, kb.ci), cmp.Compare(a.dev.UUID, b.dev.UUID))
	})
	for _, ds := range t.ordered {
		t.refreshLocked(ds)
	}
	return nil
}

type sortKey struct {
	index, mig int
	gi, ci     uint32
}

func (ds *deviceState) sortKey() sortKey {
	if ds.parent != nil {
		return sortKey{index: ds.parent.dev.Index, mig: 1, gi: ds.dev.MIG.GPUInstance, ci: ds.dev.MIG.ComputeInstance}
	}
	return sortKey{index: ds.dev.Index}
}

// SetBootID records the boot the tracker's state belongs to, for checkpoints.
func (t *Tracker) SetBootID(bootID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bootID = bootID
}

// Policy returns the policy the tracker applies.
func (t *Tracker) Policy() *Policy { return t.policy }

// Generation increases whenever any condition of any device changes (appears, clears, or changes
// severity, message or eviction). A publisher compares it to decide whether to take a snapshot.
func (t *Tracker) Generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.generation
}

// SetUnmonitored marks a device as one the backend cannot watch. It is visible in snapshots
// but does not change health.
func (t *Tracker) SetUnmonitored(uuid string, unmonitored bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[uuid]
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownDevice, uuid)
	}
	if ds.unmonitored != unmonitored {
		ds.unmonitored = unmonitored
		t.generation++
	}
	return nil
}

// Observe applies one signal and appends to out a Transition for every device whose effective
// health changed. Repeated identical signals change nothing and allocate nothing.
func (t *Tracker) Observe(sig Signal, out []Transition) ([]Transition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[sig.Device]
	if !ok {
		return out, ErrUnknownDevice
	}
	if sig.Time.After(t.lastTime) {
		t.lastTime = sig.Time
	}
	ev := evaluation{t: t, now: sig.Time, out: out}
	// Quiet periods run out on the whole physical GPU: backends sample the GPU, never a MIG
	// instance, so a quiet-period condition on an instance must end with the GPU's samples.
	gpu := ds
	if ds.parent != nil {
		gpu = ds.parent
	}
	ev.expireQuiet(gpu)
	for _, c := range gpu.children {
		ev.expireQuiet(c)
	}
	ev.apply(ds, sig)
	return ev.out, nil
}

// Tick expires quiet periods on every device as of now. Call it periodically when a backend
// may go quiet for longer than the policy's quiet period.
func (t *Tracker) Tick(now time.Time, out []Transition) []Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.After(t.lastTime) {
		t.lastTime = now
	}
	ev := evaluation{t: t, now: now, out: out}
	for _, ds := range t.ordered {
		ev.expireQuiet(ds)
	}
	return ev.out
}

// Reboot applies a node reboot: the boot ID changes and every condition that a reboot clears
// ends, as does all memory of earlier readings.
func (t *Tracker) Reboot(bootID string, now time.Time, out []Transition) []Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.bootID = bootID
	ev := evaluation{t: t, now: now, out: out}
	for _, ds := range t.ordered {
		ds.eccCorrected, ds.pcie, ds.nvlink = counterRate{}, counterRate{}, nil
		ev.removeIf(ds, ReasonNodeReboot, func(c *condState) bool { return c.ClearsOn.ClearedByReboot() })
	}
	return ev.out
}

// ClearCondition ends a condition by hand, whatever it clears on: an administrator's decision.
// A zero condType clears every condition of the device. It reports whether anything cleared.
func (t *Tracker) ClearCondition(uuid string, condType ConditionType, code uint32, now time.Time, out []Transition) ([]Transition, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[uuid]
	if !ok {
		return out, false, fmt.Errorf("%w %q", ErrUnknownDevice, uuid)
	}
	before := t.generation
	ev := evaluation{t: t, now: now, out: out}
	ev.removeIf(ds, ReasonAdminCleared, func(c *condState) bool {
		return condType == "" || (c.Type == condType && c.Code == code)
	})
	return ev.out, t.generation != before, nil
}

// ReasonAdminDrain is the reason of the condition an administrative drain raises.
const ReasonAdminDrain = "AdminDrain"

// SetDrains makes the set of administratively drained devices exactly drained (UUID to a
// message saying who drained it, when and why): each gets an Unhealthy ConditionAdmin that only
// an undrain clears, and every other device loses its drain. A drain on a GPU reaches its MIG
// instances. The drains live in the cluster, so the caller passes the whole set each time;
// unknown UUIDs are returned, not an error, since a drained GPU may be missing from this node.
func (t *Tracker) SetDrains(drained map[string]string, now time.Time, out []Transition) ([]Transition, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := evaluation{t: t, now: now, out: out}
	var unknown []string
	for uuid := range drained {
		if _, ok := t.devices[uuid]; !ok {
			unknown = append(unknown, uuid)
		}
	}
	slices.Sort(unknown)
	for _, ds := range t.ordered {
		msg, drain := drained[ds.dev.UUID]
		i := ds.find(ConditionAdmin, 0)
		switch {
		case drain && (i < 0 || ds.conds[i].Message != msg):
			ev.replace(ds, condState{Condition: Condition{
				Type: ConditionAdmin, Severity: Unhealthy, ClearsOn: ClearsOnAdmin,
				RecommendedAction: ActionInspect, Reason: ReasonAdminDrain, Message: msg,
			}})
		case !drain && i >= 0:
			ev.removeAt(ds, i, ReasonAdminCleared)
		}
	}
	return ev.out, unknown
}

// Snapshot returns a deep copy of every device's state.
func (t *Tracker) Snapshot() Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{Time: t.lastTime, BootID: t.bootID, Devices: make([]DeviceStatus, 0, len(t.ordered))}
	for _, ds := range t.ordered {
		st := DeviceStatus{
			Device:      ds.dev,
			Health:      ds.health,
			Evict:       ds.evict,
			Unmonitored: ds.unmonitored,
			Conditions:  make([]Condition, 0, len(ds.conds)),
			XIDs:        slices.Clone(ds.xids),
		}
		if ds.dev.MIG != nil {
			mig := *ds.dev.MIG
			st.Device.MIG = &mig
		}
		for _, c := range ds.conds {
			st.Conditions = append(st.Conditions, c.Condition)
		}
		if ds.parent != nil {
			for _, c := range ds.parent.conds {
				st.Conditions = append(st.Conditions, c.Condition)
			}
		}
		s.Devices = append(s.Devices, st)
	}
	return s
}

// evaluation carries one state change through the device tree and collects transitions.
type evaluation struct {
	t   *Tracker
	now time.Time
	out []Transition
}

func (ev *evaluation) apply(ds *deviceState, sig Signal) {
	// Everything but XIDs is a fact about the physical GPU.
	gpu := ds
	if sig.Kind != SignalXID && ds.parent != nil {
		gpu = ds.parent
	}
	switch sig.Kind {
	case SignalXID:
		ev.xid(ds, sig)
	case SignalLost:
		lost := ev.t.policy.Lost
		ev.raise(gpu, ConditionGPULost, 0, lost.Severity, lost.ClearsOn, lost.Evict, lost.Action, "GPULost",
			func() string { return "the GPU is lost (fell off the bus or stopped responding)" })
	case SignalReset:
		ev.reset(gpu)
	case SignalECCCounters:
		ev.ecc(gpu, sig)
	case SignalECCStorm:
		if ev.t.policy.ECC.Enabled {
			ev.raise(gpu, ConditionECCCorrectedStorm, 0, Degraded, ClearsOnQuietPeriod, false, ActionInspect, "SingleBitECCStorm",
				func() string { return "the driver reported a single-bit ECC error storm" })
		}
	case SignalRemappedRows:
		ev.remappedRows(gpu, sig)
	case SignalRetiredPages:
		if ev.t.policy.RetiredPages.Enabled && sig.Pending {
			ev.raise(gpu, ConditionRetiredPagesPending, 0, Degraded, ClearsOnGPUReset, false, ActionResetGPU, "RetiredPagesPending",
				func() string { return "retired pages are pending and take effect at the next GPU reset" })
		}
	case SignalTemperature:
		ev.temperature(gpu, sig)
	case SignalClockEvents:
		ev.clockEvents(gpu, sig)
	case SignalPCIeReplays:
		ev.pcieReplays(gpu, sig)
	case SignalNVLinkState:
		ev.nvlinkState(gpu, sig)
	case SignalNVLinkErrors:
		ev.nvlinkErrors(gpu, sig)
	case SignalRecoveryAction:
		ev.recoveryAction(gpu, sig)
	case SignalSample:
		// Quiet periods were expired before apply; a sample carries nothing else.
	}
}

// reset applies a GPU reset: volatile counters restart, and conditions that wait for a reset end
// on the GPU and its MIG instances.
func (ev *evaluation) reset(gpu *deviceState) {
	gpu.eccCorrected, gpu.pcie, gpu.nvlink = counterRate{}, counterRate{}, nil
	resetClears := func(c *condState) bool { return c.ClearsOn == ClearsOnGPUReset }
	for _, child := range gpu.children {
		ev.removeIf(child, ReasonGPUReset, resetClears)
	}
	ev.removeIf(gpu, ReasonGPUReset, resetClears)
}

// xid applies an XID. An XID scoped to a MIG GPU instance (and possibly a compute instance)
// concerns the matching MIG devices only; an unscoped one concerns the GPU, and through it every
// instance. When no known instance matches, the whole GPU takes the fault: failing safe beats
// losing it.
func (ev *evaluation) xid(ds *deviceState, sig Signal) {
	rule, _ := ev.t.policy.XIDRuleFor(sig.XID)
	if sig.MIGScoped && ds.parent == nil {
		matched := false
		for _, c := range ds.children {
			if c.dev.MIG.GPUInstance != sig.GPUInstance ||
				(sig.ComputeInstance != NoInstance && c.dev.MIG.ComputeInstance != sig.ComputeInstance) {
				continue
			}
			matched = true
			ev.xidOn(c, sig.XID, rule)
		}
		if matched {
			return
		}
	}
	ev.xidOn(ds, sig.XID, rule)
}

func (ev *evaluation) xidOn(ds *deviceState, xid uint32, rule XIDRule) {
	ds.countXID(xid, ev.now)
	if rule.FollowRecoveryAction || rule.Severity == Healthy {
		return
	}
	if i := ds.find(ConditionXID, xid); i >= 0 {
		c := &ds.conds[i]
		c.LastSeen = ev.now
		if c.Severity == rule.Severity && c.ClearsOn == rule.ClearsOn && c.Evict == rule.Evict {
			return
		}
	}
	desc := rule.Description
	if desc == "" {
		desc = "unknown XID"
	}
	ev.replace(ds, condState{Condition: Condition{
		Type: ConditionXID, Code: xid, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: fmt.Sprintf("XID%d", xid), Message: fmt.Sprintf("XID %d: %s", xid, desc),
	}})
}

func (ds *deviceState) countXID(xid uint32, now time.Time) {
	for i := range ds.xids {
		if ds.xids[i].XID == xid {
			ds.xids[i].Count++
			ds.xids[i].LastSeen = now
			return
		}
	}
	ds.xids = append(ds.xids, XIDCount{XID: xid, Count: 1, LastSeen: now})
	slices.SortFunc(ds.xids, func(a, b XIDCount) int { return cmp.Compare(a.XID, b.XID) })
}

func (ev *evaluation) ecc(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ECC.Enabled {
		return
	}
	if sig.Uncorrected > 0 {
		ev.raise(gpu, ConditionECCUncorrected, 0, Unhealthy, ClearsOnGPUReset, false, ActionResetGPU, "UncorrectedECCErrors",
			func() string {
				return fmt.Sprintf("%d uncorrected volatile ECC errors since the last GPU reset", sig.Uncorrected)
			})
	}
	if rate, ok := gpu.eccCorrected.perMinute(int64(sig.Corrected), ev.now); ok && rate > p.ECC.CorrectedStormPerMinute {
		ev.raise(gpu, ConditionECCCorrectedStorm, 0, Degraded, ClearsOnQuietPeriod, false, ActionInspect, "SingleBitECCStorm",
			func() string {
				return fmt.Sprintf("corrected ECC error rate %.0f/min is above %.0f/min", rate, p.ECC.CorrectedStormPerMinute)
			})
	}
}

func (ev *evaluation) remappedRows(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RowRemap.Enabled {
		return
	}
	failure := Healthy
	if sig.Failure {
		failure = Unhealthy
	}
	ev.polled(gpu, ConditionRowRemapFailure, 0, failure, DefaultRecoverySamples, ActionCheckHardware, "RowRemapFailure",
		func() string { return "row remapping failed: no spare row was left for a bad memory row" })
	if sig.Pending {
		ev.raise(gpu, ConditionRowRemapPending, 0, Degraded, ClearsOnGPUReset, false, ActionResetGPU, "RowRemapPending",
			func() string { return "a row remap is pending and takes effect at the next GPU reset" })
	}
}

func (ev *evaluation) temperature(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.Thermal.Enabled {
		return
	}
	slowdown, shutdown := sig.SlowdownC, sig.ShutdownC
	if slowdown <= 0 {
		slowdown = DefaultSlowdownC
	}
	if shutdown <= 0 {
		shutdown = DefaultShutdownC
	}
	if p.Thermal.SlowdownC > 0 {
		slowdown = p.Thermal.SlowdownC
	}
	if p.Thermal.ShutdownC > 0 {
		shutdown = p.Thermal.ShutdownC
	}
	switch {
	case sig.Value >= shutdown:
		ev.polled(gpu, ConditionThermal, 0, Unhealthy, p.Thermal.RecoverySamples, ActionCheckCooling, "TemperatureAtShutdown",
			func() string {
				return fmt.Sprintf("temperature %d°C reached the shutdown threshold %d°C", sig.Value, shutdown)
			})
	case sig.Value >= slowdown:
		ev.polled(gpu, ConditionThermal, 0, Degraded, p.Thermal.RecoverySamples, ActionCheckCooling, "TemperatureAtSlowdown",
			func() string {
				return fmt.Sprintf("temperature %d°C reached the slowdown threshold %d°C", sig.Value, slowdown)
			})
	default:
		ev.polled(gpu, ConditionThermal, 0, Healthy, p.Thermal.RecoverySamples, "", "", nil)
	}
}

func (ev *evaluation) clockEvents(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.ClockEvents.Enabled {
		return
	}
	active := sig.Reasons & p.ClockEvents.Reasons
	if active == 0 {
		ev.polled(gpu, ConditionClockThrottle, 0, Healthy, p.ClockEvents.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionClockThrottle, 0, Degraded, p.ClockEvents.RecoverySamples, ActionCheckCooling, "ClocksThrottled",
		func() string { return "clocks are throttled: " + active.String() })
}

func (ev *evaluation) pcieReplays(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.PCIeReplays.Enabled {
		return
	}
	rate, ok := gpu.pcie.perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	if rate <= p.PCIeReplays.PerMinute {
		ev.polled(gpu, ConditionPCIeReplayRate, 0, Healthy, p.PCIeReplays.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionPCIeReplayRate, 0, Degraded, p.PCIeReplays.RecoverySamples, ActionInspect, "PCIeReplayRateHigh",
		func() string {
			return fmt.Sprintf("PCIe replay rate %.0f/min is above %.0f/min", rate, p.PCIeReplays.PerMinute)
		})
}

func (ev *evaluation) nvlinkState(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	if !sig.Down {
		ev.polled(gpu, ConditionNVLinkDown, sig.Link, Healthy, p.NVLink.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionNVLinkDown, sig.Link, Unhealthy, p.NVLink.RecoverySamples, ActionResetGPU, "NVLinkDown",
		func() string { return fmt.Sprintf("NVLink %d is down", sig.Link) })
}

func (ev *evaluation) nvlinkErrors(gpu *deviceState, sig Signal) {
	p := ev.t.policy
	if !p.NVLink.Enabled || sig.Link >= maxTrackedLinks {
		return
	}
	if int(sig.Link) >= len(gpu.nvlink) {
		gpu.nvlink = append(gpu.nvlink, make([]counterRate, int(sig.Link)+1-len(gpu.nvlink))...)
	}
	rate, ok := gpu.nvlink[sig.Link].perMinute(sig.Value, ev.now)
	if !ok {
		return
	}
	if rate <= p.NVLink.ErrorsPerMinute {
		ev.polled(gpu, ConditionNVLinkErrorRate, sig.Link, Healthy, p.NVLink.RecoverySamples, "", "", nil)
		return
	}
	ev.polled(gpu, ConditionNVLinkErrorRate, sig.Link, Degraded, p.NVLink.RecoverySamples, ActionInspect, "NVLinkErrorRateHigh",
		func() string {
			return fmt.Sprintf("NVLink %d error rate %.0f/min is above %.0f/min", sig.Link, rate, p.NVLink.ErrorsPerMinute)
		})
}

func (ev *evaluation) recoveryAction(gpu *deviceState, sig Signal) {
	if !ev.t.policy.RecoveryAction.Enabled {
		return
	}
	var (
		sev      Severity
		clearsOn ClearsOn
		action   Action
	)
	switch sig.Action {
	case RecoveryNone:
		ev.removeIf(gpu, ReasonRecoveryActionNone, func(c *condState) bool { return c.Type == ConditionRecoveryAction })
		return
	case RecoveryGPUReset:
		sev, clearsOn, action = Unhealthy, ClearsOnGPUReset, ActionResetGPU
	case RecoveryDrainAndReset:
		sev, clearsOn, action = Unhealthy, ClearsOnGPUReset, ActionDrainAndResetGPU
	case RecoveryNodeReboot:
		sev, clearsOn, action = Unhealthy, ClearsOnNodeReboot, ActionRebootNode
	case RecoveryDrainP2P:
		sev, clearsOn, action = Degraded, ClearsOnRecovered, ActionDrainP2P
	default:
		sev, clearsOn, action = Unhealthy, ClearsOnGPUReset, ActionInspect
	}
	if i := gpu.find(ConditionRecoveryAction, 0); i >= 0 && gpu.conds[i].RecommendedAction == action {
		gpu.conds[i].LastSeen = ev.now
		return
	}
	ev.replace(gpu, condState{Condition: Condition{
		Type: ConditionRecoveryAction, Severity: sev, ClearsOn: clearsOn, RecommendedAction: action,
		Reason:  recoveryReasons[sig.Action],
		Message: "NVML recommends recovery action " + sig.Action.String(),
	}})
}

var recoveryReasons = map[RecoveryAction]string{
	RecoveryGPUReset:      "RecoveryActionGPUReset",
	RecoveryNodeReboot:    "RecoveryActionNodeReboot",
	RecoveryDrainP2P:      "RecoveryActionDrainP2P",
	RecoveryDrainAndReset: "RecoveryActionDrainAndReset",
}

// raise sets a condition, keeping its Since when it already exists.
// msg is called only when the condition is new or changes, so repeated signals build no strings.
func (ev *evaluation) raise(ds *deviceState, typ ConditionType, code uint32, sev Severity, clearsOn ClearsOn, evict bool, action Action, reason string, msg func() string) {
	if i := ds.find(typ, code); i >= 0 {
		c := &ds.conds[i]
		c.LastSeen = ev.now
		if c.Severity == sev && c.ClearsOn == clearsOn && c.Evict == evict && c.Reason == reason {
			return
		}
	}
	ev.replace(ds, condState{Condition: Condition{
		Type: typ, Code: code, Severity: sev, ClearsOn: clearsOn, Evict: evict,
		RecommendedAction: action, Reason: reason, Message: msg(),
	}})
}

// replace installs c, keeping Since from a condition it replaces, and re-evaluates the device.
func (ev *evaluation) replace(ds *deviceState, c condState) {
	c.LastSeen = ev.now
	c.Since = ev.now
	if i := ds.find(c.Type, c.Code); i >= 0 {
		c.Since = ds.conds[i].Since
		ds.conds[i] = c
	} else {
		ds.conds = append(ds.conds, c)
	}
	ev.t.generation++
	ev.refresh(ds, "")
}

// polled applies a reading-based check with hysteresis: a worse reading takes effect at once;
// a better one only after recoverySamples consecutive samples call for it.
func (ev *evaluation) polled(ds *deviceState, typ ConditionType, code uint32, target Severity, recoverySamples int, action Action, reason string, msg func() string) {
	i := ds.find(typ, code)
	current := Healthy
	if i >= 0 {
		current = ds.conds[i].Severity
	}
	switch {
	case target > current:
		ev.replace(ds, condState{Condition: Condition{
			Type: typ, Code: code, Severity: target, ClearsOn: ClearsOnRecovered,
			RecommendedAction: action, Reason: reason, Message: msg(),
		}})
	case i < 0:
		return
	case target == current:
		ds.conds[i].cleanSamples = 0
		ds.conds[i].LastSeen = ev.now
	default:
		// Readings at one instant count once; a reading from before the last one counted means
		// the clock stepped back, and counts as a new sample rather than stalling recovery until
		// the clock catches up.
		if ds.conds[i].cleanSamples > 0 && ev.now.Equal(ds.conds[i].cleanAt) {
			return
		}
		ds.conds[i].cleanSamples++
		ds.conds[i].cleanAt = ev.now
		if ds.conds[i].cleanSamples < max(recoverySamples, 1) {
			return
		}
		if target == Healthy {
			ev.removeAt(ds, i, ReasonRecovered)
			return
		}
		c := ds.conds[i]
		c.Severity, c.Reason, c.Message, c.cleanSamples = target, reason, msg(), 0
		ds.conds[i] = c
		ev.t.generation++
		ev.refresh(ds, ReasonRecovered)
	}
}

func (ev *evaluation) expireQuiet(ds *deviceState) {
	quiet := ev.t.policy.QuietPeriod
	for i := 0; i < len(ds.conds); i++ {
		c := &ds.conds[i]
		if c.ClearsOn != ClearsOnQuietPeriod {
			continue
		}
		if ev.now.Before(c.LastSeen) {
			// The clock stepped back: the quiet period restarts on the new clock instead of
			// lasting until the old one is reached again.
			c.LastSeen = ev.now
			continue
		}
		if ev.now.Sub(c.LastSeen) >= quiet {
			ev.removeAt(ds, i, ReasonQuietPeriodElapsed)
			i--
		}
	}
}

func (ev *evaluation) removeIf(ds *deviceState, reason string, match func(*condState) bool) {
	removed := false
	ds.conds = slices.DeleteFunc(ds.conds, func(c condState) bool {
		if match(&c) {
			removed = true
			return true
		}
		return false
	})
	if removed {
		ev.t.generation++
		ev.refresh(ds, reason)
	}
}

func (ev *evaluation) removeAt(ds *deviceState, i int, reason string) {
	ds.conds = slices.Delete(ds.conds, i, i+1)
	ev.t.generation++
	ev.refresh(ds, reason)
}

func (ds *deviceState) find(typ ConditionType, code uint32) int {
	for i := range ds.conds {
		if ds.conds[i].Type == typ && ds.conds[i].Code == code {
			return i
		}
	}
	return -1
}

// refresh recomputes a device's effective health, and its MIG instances', recording
// transitions. clearReason explains a change for the better.
func (ev *evaluation) refresh(ds *deviceState, clearReason string) {
	ds.own, ds.ownEvict = Healthy, false
	for i := range ds.conds {
		ds.own = max(ds.own, ds.conds[i].Severity)
		ds.ownEvict = ds.ownEvict || ds.conds[i].Evict
	}
	ev.settle(ds, clearReason)
	for _, c := range ds.children {
		ev.settle(c, clearReason)
	}
}

func (ev *evaluation) settle(ds *deviceState, clearReason string) {
	from := ds.health
	ev.t.refreshLocked(ds)
	if ds.health == from {
		return
	}
	reason := clearReason
	if ds.health > from || reason == "" {
		reason = ds.worstReason()
	}
	ev.out = append(ev.out, Transition{Time: ev.now, Device: ds.dev, From: from, To: ds.health, Reason: reason})
}

// refreshLocked recomputes effective health from the device's and its parent's own state.
func (t *Tracker) refreshLocked(ds *deviceState) {
	ds.health, ds.evict = ds.own, ds.ownEvict
	if ds.parent != nil {
		ds.health = max(ds.health, ds.parent.own)
		ds.evict = ds.evict || ds.parent.ownEvict
	}
}

// worstReason returns the reason of the most severe condition in effect, the earliest raised
// among equals.
func (ds *deviceState) worstReason() string {
	var best *Condition
	consider := func(cs []condState) {
		for i := range cs {
			c := &cs[i].Condition
			if best == nil || c.Severity > best.Severity || (c.Severity == best.Severity && c.Since.Before(best.Since)) {
				best = c
			}
		}
	}
	consider(ds.conds)
	if ds.parent != nil {
		consider(ds.parent.conds)
	}
	if best == nil {
		return ""
	}
	return best.Reason
}
