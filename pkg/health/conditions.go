package health

import "slices"

// raiseSpec is a condition a check raises outright, named field by field as the Condition it
// becomes. The message is raise's own argument, a function called only when the condition is new
// or changes, so that repeated signals build no strings. It is not a field because escape
// analysis treats a struct as one value: raise keeps the spec's strings, so a closure inside it
// would escape to the heap and cost an allocation on every signal.
type raiseSpec struct {
	Type              ConditionType
	Code              uint32
	Severity          Severity
	ClearsOn          ClearsOn
	Evict             bool
	RecommendedAction Action
	Reason            string
}

// raise sets a condition, keeping its Since when it already exists. A condition that exists
// with the same severity, clearing, eviction and reason is only seen again: its message and
// recommended action stay as they are. msg is called only when the condition is new or changes.
func (ev *evaluation) raise(ds *deviceState, r raiseSpec, msg func() string) {
	if i := ds.find(r.Type, r.Code); i >= 0 {
		c := &ds.conds[i]
		c.LastSeen = ev.now
		if c.Severity == r.Severity && c.ClearsOn == r.ClearsOn && c.Evict == r.Evict && c.Reason == r.Reason {
			return
		}
	}
	ev.replace(ds, condState{Condition: Condition{
		Type: r.Type, Code: r.Code, Severity: r.Severity, ClearsOn: r.ClearsOn, Evict: r.Evict,
		RecommendedAction: r.RecommendedAction, Reason: r.Reason, Message: msg(),
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
	if c.Severity == Unhealthy && sticky(c.Condition) {
		gpu := ds
		if ds.parent != nil {
			gpu = ds.parent
		}
		ev.fault(gpu, c.Condition)
	}
}

// pollSpec is what one sample of a polled check calls for, field by field as the Condition it
// becomes, less the message (for the reason given at raiseSpec). A polled condition clears on
// ClearsOnRecovered and never asks for eviction.
type pollSpec struct {
	Type ConditionType
	Code uint32
	// Severity is what the sample calls for; Healthy asks for the condition to clear, and then
	// RecommendedAction, Reason and the message are not used.
	Severity Severity
	// RecoverySamples is how many consecutive samples must call for less than the current
	// severity before it drops; fewer than one counts as one.
	RecoverySamples   int
	RecommendedAction Action
	Reason            string
}

// polled applies a reading-based check with hysteresis: a worse reading takes effect at once;
// a better one only after RecoverySamples consecutive samples call for it. A drop to a severity
// other than Healthy changes the reason and message, not the recommended action. msg is called
// only when the condition is new or changes, and may be nil when r.Severity is Healthy.
func (ev *evaluation) polled(ds *deviceState, r pollSpec, msg func() string) {
	target := r.Severity
	i := ds.find(r.Type, r.Code)
	current := Healthy
	if i >= 0 {
		current = ds.conds[i].Severity
	}
	switch {
	case target > current:
		ev.replace(ds, condState{Condition: Condition{
			Type: r.Type, Code: r.Code, Severity: target, ClearsOn: ClearsOnRecovered,
			RecommendedAction: r.RecommendedAction, Reason: r.Reason, Message: msg(),
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
		if ds.conds[i].cleanSamples < max(r.RecoverySamples, 1) {
			return
		}
		if target == Healthy {
			ev.removeAt(ds, i, ReasonRecovered)
			return
		}
		c := ds.conds[i]
		c.Severity, c.Reason, c.Message, c.cleanSamples = target, r.Reason, msg(), 0
		ds.conds[i] = c
		ev.t.generation++
		ev.refresh(ds, ReasonRecovered)
	}
}

// expireQuiet ends the device's conditions that clear on a quiet period once their signal has
// not been seen for the policy's QuietPeriod.
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

// removeIf ends every condition of the device that match selects; reason explains the change in
// the transitions it causes.
func (ev *evaluation) removeIf(ds *deviceState, reason string, match func(*condState) bool) {
	// In place and by pointer: slices.DeleteFunc would hand match a copy of each condition,
	// which escapes through match and cost an allocation per condition on every call (a
	// recovery action of none, sampled every interval, clears through here).
	kept := 0
	for i := range ds.conds {
		if match(&ds.conds[i]) {
			continue
		}
		if kept != i {
			ds.conds[kept] = ds.conds[i]
		}
		kept++
	}
	if kept == len(ds.conds) {
		return
	}
	clear(ds.conds[kept:])
	ds.conds = ds.conds[:kept]
	ev.t.generation++
	ev.refresh(ds, reason)
}

// removeAt ends the device's i-th condition; reason explains the change in the transitions it
// causes.
func (ev *evaluation) removeAt(ds *deviceState, i int, reason string) {
	ds.conds = slices.Delete(ds.conds, i, i+1)
	ev.t.generation++
	ev.refresh(ds, reason)
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

// settle records a transition when the device's effective health changed.
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
	var msg string
	if c := ds.worst(); c != nil && ds.health > Healthy {
		msg = c.Message
	}
	ev.out = append(ev.out, Transition{Time: ev.now, Device: ds.dev, From: from, To: ds.health, Reason: reason, Message: msg})
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
	if c := ds.worst(); c != nil {
		return c.Reason
	}
	return ""
}

// worst is the condition in effect that sets the device's health (the device's own or its
// parent's): the most severe, the earliest among equals; nil when there is none.
func (ds *deviceState) worst() *Condition {
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
	return best
}

// WorstFirst returns the conditions ordered by severity, most severe first, earliest first
// among equals; the input is not changed.
func WorstFirst(conds []Condition) []Condition {
	out := slices.Clone(conds)
	slices.SortStableFunc(out, func(a, b Condition) int {
		if a.Severity != b.Severity {
			return int(b.Severity) - int(a.Severity)
		}
		return a.Since.Compare(b.Since)
	})
	return out
}
