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

// xidOn counts an XID on one device and raises the condition its rule asks for. It does not go
// through raise: the XID's reason and message are formatted, so it compares severity, clearing
// and eviction before building them (one XID always has the same reason), and a storm of one
// XID allocates nothing.
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
