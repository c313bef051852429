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
	var root rootFault
	if sig.XIDFlags&XIDCausedByPrevious != 0 {
		root = ev.rootCause(ds, sig.CauseXID, ev.now, false)
	}
	softened := root.found() || sig.XIDFlags&XIDNonfatal != 0
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
	ev.replace(ds, ev.xidCondition(xid, sig.XIDFlags, sig.CauseXID, root))
}

// xidCondition is the condition an XID's rule raises, bent by what the driver said beside the
// code (flags; cause, the XID it named as the cause): attributed to root when one was found,
// else, for a Nonfatal XID, Degraded at most, no eviction, and a message that says so.
func (ev *evaluation) xidCondition(xid uint32, flags XIDFlags, cause uint32, root rootFault) condState {
	rule, _ := ev.t.policy.XIDRuleFor(xid)
	desc := rule.Description
	if desc == "" {
		desc = "unknown XID"
	}
	c := condState{Condition: Condition{
		Type: ConditionXID, Code: xid, Severity: rule.Severity, ClearsOn: rule.ClearsOn, Evict: rule.Evict,
		RecommendedAction: rule.Action, Reason: fmt.Sprintf("XID%d", xid), Message: fmt.Sprintf("XID %d: %s", xid, desc),
		CausedByPrevious: flags&XIDCausedByPrevious != 0,
	}, flags: flags, causeXID: cause}
	switch {
	case root.found():
		root.attribute(&c.Condition)
	case flags&XIDNonfatal != 0:
		c.Severity, c.Evict = min(c.Severity, Degraded), false
		c.Message += " (Nonfatal)"
	}
	return c
}

// rootFault is the fault an XID the driver says an earlier one caused is attributed to: an XID
// of another GPU of this node (local), or of a GPU of a peer node in the same NVLink domain
// (peer, see PeerFault).
type rootFault struct {
	local *deviceState
	peer  *PeerFault
	xid   uint32
	seen  time.Time
}

func (r rootFault) found() bool { return r.local != nil || r.peer != nil }

// attribute makes an XID condition the consequence of r: Degraded at most, no eviction, the
// action inspect, a reason naming the root (XID45CausedByGPU3, or XID45CausedByPeerGPU for a
// peer's, whose node a reason cannot hold) and a message saying which XID of which GPU.
func (r rootFault) attribute(c *Condition) {
	c.Severity, c.Evict, c.RecommendedAction = min(c.Severity, Degraded), false, ActionInspect
	if r.local != nil {
		c.Reason = fmt.Sprintf("XID%dCausedByGPU%d", c.Code, r.local.dev.Index)
		c.Message += fmt.Sprintf(", caused by XID %d on GPU %d (%s)", r.xid, r.local.dev.Index, r.local.dev.UUID)
		return
	}
	c.Reason = peerReason(c.Code)
	c.Message += r.peer.causeText()
}

// rootCause finds the fault an XID on ds at time at followed: an Unhealthy XID condition of
// another physical GPU of this node, not itself caused by another, seen within the policy's
// RootCauseWindow before at; or a peer's fault (PeerFault) that began within the window either
// side of at (the peer's agent reports it after its own debounce, and the nodes' clocks differ a
// little). A fault of this node's GPUs of the XID the driver named (cause, when not zero) beats
// any other, then the most recent wins; a peer's fault must be of the XID the driver named, since
// a peer's report is its own claim (SetPeerFaults). None found: the XID keeps its rule, since
// failing safe beats blaming a GPU nobody saw fail. peersOnly looks at the peers' faults alone: when an XID already raised is
// judged again, a fault this node's GPUs had then was found then, and one that came after it
// did not cause it.
func (ev *evaluation) rootCause(ds *deviceState, cause uint32, at time.Time, peersOnly bool) rootFault {
	self := ds
	if ds.parent != nil {
		self = ds.parent
	}
	window := ev.t.policy.RootCauseWindow
	var root rootFault
	better := func(xid uint32, seen time.Time) bool {
		if !root.found() {
			return true
		}
		if (xid == cause) != (root.xid == cause) {
			return xid == cause
		}
		return seen.After(root.seen)
	}
	for _, other := range ev.t.ordered {
		if peersOnly || other == self || other.parent != nil {
			continue
		}
		for i := range other.conds {
			c := &other.conds[i]
			if c.Type != ConditionXID || c.CausedByPrevious || c.Severity < Unhealthy || at.Sub(c.LastSeen) > window {
				continue
			}
			if better(c.Code, c.LastSeen) {
				root = rootFault{local: other, xid: c.Code, seen: c.LastSeen}
			}
		}
	}
	for i := range ev.t.peers {
		p := &ev.t.peers[i]
		// Only the fault the driver named: any other, a forged one included, explains nothing.
		if cause == 0 || p.XID != cause {
			continue
		}
		if d := at.Sub(p.Since); d > window || d < -window {
			continue
		}
		if better(p.XID, p.Since) {
			root = rootFault{peer: p, xid: p.XID, seen: p.Since}
		}
	}
	return root
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
