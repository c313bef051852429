package health

import "slices"

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
