package health

import "time"

// deviceState is what the Tracker knows about one device: its own conditions, its place in the
// GPU/MIG tree, and the memory of earlier readings that rate checks need.
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
	// uncheckable lists, sorted, the checks the backend cannot run on the device.
	uncheckable []Check

	// repeats holds each repeat rule's memory, by the rule's place in Policy.Repeats; nil
	// until an XID a rule counts arrives.
	repeats []repeatState
	// history is a physical GPU's faults and repairs, oldest first, at most MaxHistory; it
	// outlives conditions, restarts and reboots (see HistoryEntry).
	history []HistoryEntry

	// fabricPendingSince is when a registration not yet completed was first read; zero when
	// none is pending. nvlinkRecov holds each link's recovery count at the start of its window.
	fabricPendingSince time.Time
	nvlinkRecov        []counterRate

	eccCorrected counterRate
	pcie         counterRate
	nvlink       []counterRate
}

// find returns the index of the device's own condition of type typ and code, or -1.
func (ds *deviceState) find(typ ConditionType, code uint32) int {
	for i := range ds.conds {
		if ds.conds[i].Type == typ && ds.conds[i].Code == code {
			return i
		}
	}
	return -1
}

// condState is a condition plus the hysteresis memory of the check that owns it.
type condState struct {
	Condition
	// cleanSamples counts consecutive samples whose reading called for less than the current
	// severity; cleanAt is the time of the last one counted, so that several readings at one
	// instant count once.
	cleanSamples int
	cleanAt      time.Time
	// flags and causeXID are what the driver said beside an XID condition's code (XIDFlags) and
	// the XID it named as the cause of a CausedByPrevious one (zero when it named none), for
	// judging it again against the peers' faults (SetPeerFaults). A checkpoint keeps neither.
	flags    XIDFlags
	causeXID uint32
}

// maxTrackedLinks bounds the NVLink numbers the tracker keeps state for; signals about higher
// links are ignored, so a bad link number cannot grow a device's state.
const maxTrackedLinks = 64

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

// sortKey orders devices for snapshots: by index, each GPU before its MIG instances, the
// instances by GPU instance and then compute instance.
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
