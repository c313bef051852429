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
	// cursors says how far each replayable source has been applied (see Advance).
	cursors map[string]Cursor
	// findings are the node findings in effect (see NodeFinding), in the order raised.
	findings []NodeFinding
	// findingsSettled is a time up to which no finding of a spread rule can end (each was seen
	// within its rule's window of it), so that expireFindings, called on every signal, has
	// nothing to look at before then; the zero time makes its next call look.
	findingsSettled time.Time
	// peers are the faults of the GPUs of the peer nodes in this node's NVLink domain, most
	// recent first (see SetPeerFaults).
	peers []PeerFault
	// missingMarked says the placeholders' GPUMissing is raised: at the first moment the
	// tracker is told the time (a signal, a tick, a restore), which is then its Since.
	missingMarked bool
	// rebootRepaired are the GPUs that had a fault pending when the node rebooted, as Restore
	// found them in a checkpoint of an earlier boot (see RebootRepaired).
	rebootRepaired []string
	// requests are the operators' requests applied, by key, with the time each was written
	// (see RequestApplied).
	requests map[string]time.Time
}

// RebootRepaired returns the physical GPUs that had a fault no repair had ended (Unhealthy,
// given up on by remediation, to be replaced) when the node rebooted, as the checkpoint of the
// earlier boot says: the GPUs an agent validates before it offers them again.
func (t *Tracker) RebootRepaired() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.rebootRepaired)
}

// RecordValidation records how a repaired GPU's return to service was judged in its history
// (HistoryValidation), which the checkpoint keeps and reports carry.
func (t *Tracker) RecordValidation(uuid string, result ValidationResult, by string, at time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[uuid]
	if !ok || ds.parent != nil {
		return fmt.Errorf("%w %q", ErrUnknownDevice, uuid)
	}
	ds.record(HistoryEntry{Time: at, Kind: HistoryValidation, Reason: string(result), By: by})
	t.generation++
	return nil
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
	return t.observeLocked(sig, out)
}

func (t *Tracker) observeLocked(sig Signal, out []Transition) ([]Transition, error) {
	ds, ok := t.devices[sig.Device]
	if !ok {
		return out, ErrUnknownDevice
	}
	if sig.Time.After(t.lastTime) {
		t.lastTime = sig.Time
	}
	ev := evaluation{t: t, now: sig.Time, out: out}
	ev.out = t.markMissingOnce(&ev)
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
	t.expireFindings(sig.Time)
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
	ev.out = t.markMissingOnce(&ev)
	for _, ds := range t.ordered {
		ev.expireQuiet(ds)
	}
	t.expireFindings(now)
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
		if ds.parent == nil {
			ds.recordRepair(HistoryReboot, now)
		}
		ds.eccCorrected, ds.pcie, ds.nvlink, ds.repeats = counterRate{}, counterRate{}, nil, nil
		ds.fabricPendingSince, ds.nvlinkRecov = time.Time{}, nil
		ev.removeIf(ds, ReasonNodeReboot, func(c *condState) bool { return c.ClearsOn.ClearedByReboot() })
	}
	if len(t.findings) > 0 {
		t.findings = nil
		t.generation++
	}
	// A reboot does not bring a GPU back that the backend still cannot open.
	t.missingMarked = true
	ev.out = t.markMissingEv(&ev)
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
	cleared := t.generation != before
	// Clearing a GPU whole, its escalation or its past on other nodes says the card was
	// inspected or replaced: its earlier faults no longer count towards another escalation, here
	// or (through its GPURecord) anywhere.
	if cleared && ds.parent == nil && (condType == "" || condType == ConditionReplaceGPU || condType == ConditionRepeatOffender) {
		ds.record(HistoryEntry{Time: now, Kind: HistoryCleared})
	}
	return ev.out, cleared, nil
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
	for _, f := range t.findings {
		f.GPUs = slices.Clone(f.GPUs)
		s.Findings = append(s.Findings, f)
	}
	for _, ds := range t.ordered {
		st := DeviceStatus{
			Device:            ds.dev,
			Health:            ds.health,
			Evict:             ds.evict,
			Unmonitored:       ds.unmonitored,
			UnmonitoredChecks: slices.Clone(ds.uncheckable),
			Conditions:        make([]Condition, 0, len(ds.conds)),
			XIDs:              slices.Clone(ds.xids),
			History:           slices.Clone(ds.history),
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
