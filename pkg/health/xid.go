package health

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// xid applies an XID. An XID scoped to a MIG GPU instance (and possibly a compute instance)
// concerns the matching MIG devices only; an unscoped one concerns the GPU, and through it every
// instance. When no known instance matches, the whole GPU takes the fault: failing safe beats
// losing it.
func (ev *evaluation) xid(ds *deviceState, sig Signal) {
	rule, _ := ev.t.policy.XIDRuleFor(sig.XID)
	gpu := ds
	if ds.parent != nil {
		gpu = ds.parent
	}
	// An XID the driver says an earlier one caused (XID 45 after a 149: NVSentinel#1712 saw
	// 168,924 of them in two days) is the echo of a fault already judged: it counts towards no
	// repeat rule.
	if sig.XIDFlags&XIDCausedByPrevious == 0 {
		ev.repeats(gpu, sig.XID)
	}
	if sig.MIGScoped && ds.parent == nil {
		matched := false
		for _, c := range ds.children {
			if c.dev.MIG.GPUInstance != sig.GPUInstance ||
				(sig.ComputeInstance != NoInstance && c.dev.MIG.ComputeInstance != sig.ComputeInstance) {
				continue
			}
			matched = true
			ev.xidOn(c, sig, rule)
		}
		if matched {
			return
		}
	}
	ev.xidOn(ds, sig, rule)
}

// xidOn counts an XID on one device and raises the condition its rule asks for. It does not go
// through raise: the XID's reason and message are formatted, so it compares severity, clearing
// and eviction before building them (one XID always has the same reason), and a storm of one
// XID allocates nothing.
//
// What the driver said beside the code bends the rule: a Nonfatal XID is Degraded at most and
// never evicts, and an XID an earlier one caused, on a node where another GPU has a fault of its
// own within the policy's RootCauseWindow, is attributed to that GPU (see consequence). Neither
// ever lowers a condition already in effect.
func (ev *evaluation) xidOn(ds *deviceState, sig Signal, rule XIDRule) {
	xid := sig.XID
	ds.countXID(xid, ev.now)
	if rule.FollowRecoveryAction || rule.Severity == Healthy {
		return
	}
	var root *deviceState
	var rootXID uint32
	if sig.XIDFlags&XIDCausedByPrevious != 0 {
		root, rootXID = ev.rootCause(ds, sig.CauseXID)
	}
	softened := root != nil || sig.XIDFlags&XIDNonfatal != 0
	if softened {
		rule.Severity, rule.Evict = min(rule.Severity, Degraded), false
	}
	if i := ds.find(ConditionXID, xid); i >= 0 {
		c := &ds.conds[i]
		c.LastSeen = ev.now
		if c.Severity == rule.Severity && c.ClearsOn == rule.ClearsOn && c.Evict == rule.Evict {
			return
		}
		if softened && c.Severity >= rule.Severity {
			return // a softer report of a fault already in effect changes nothing
		}
	}
	desc := rule.Description
	if desc == "" {
		desc = "unknown XID"
	}
	cond := condState{Condition: Condition{
		Type: ConditionXID, Code: xid, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: fmt.Sprintf("XID%d", xid), Message: fmt.Sprintf("XID %d: %s", xid, desc),
	}, consequential: sig.XIDFlags&XIDCausedByPrevious != 0}
	switch {
	case root != nil:
		cond.Reason = fmt.Sprintf("XID%dCausedByGPU%d", xid, root.dev.Index)
		cond.Message = fmt.Sprintf("XID %d: %s, caused by XID %d on GPU %d (%s)", xid, desc, rootXID, root.dev.Index, root.dev.UUID)
		cond.RecommendedAction = ActionInspect
	case sig.XIDFlags&XIDNonfatal != 0:
		cond.Message += " (Nonfatal)"
	}
	ev.replace(ds, cond)
}

// rootCause finds the GPU whose fault an XID on ds followed: another physical GPU with an
// Unhealthy XID condition of its own, not itself caused by another, seen within the policy's
// RootCauseWindow; a fault of the XID the driver named (cause, when not zero) beats any other,
// then the most recent wins. It returns nil when there is none: the XID then keeps its rule,
// since failing safe beats blaming a GPU nobody saw fail.
func (ev *evaluation) rootCause(ds *deviceState, cause uint32) (*deviceState, uint32) {
	self := ds
	if ds.parent != nil {
		self = ds.parent
	}
	var root *deviceState
	var rootXID uint32
	var rootSeen time.Time
	for _, other := range ev.t.ordered {
		if other == self || other.parent != nil {
			continue
		}
		for i := range other.conds {
			c := &other.conds[i]
			if c.Type != ConditionXID || c.consequential || c.Severity < Unhealthy || ev.now.Sub(c.LastSeen) > ev.t.policy.RootCauseWindow {
				continue
			}
			better := root == nil || (c.Code == cause) != (rootXID == cause) && c.Code == cause ||
				(c.Code == cause) == (rootXID == cause) && c.LastSeen.After(rootSeen)
			if better {
				root, rootXID, rootSeen = other, c.Code, c.LastSeen
			}
		}
	}
	return root, rootXID
}

// countXID counts every XID, including those that change nothing, keeping the counts sorted by
// XID for snapshots.
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
