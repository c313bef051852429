package health

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// PeerFault is an XID fault another node's agent reports on one of its GPUs, a GPU of the same
// NVLink domain (a GB200 NVL72 rack is one): the driver on this node may log that fault as the
// cause of an XID of its own ("caused by previous Xid 149"), since a GPU's NVLink error reaches
// every GPU it was talking to. Such an XID is then attributed to the peer's GPU, as one caused by
// another GPU of this node is (see Tracker.SetPeerFaults).
type PeerFault struct {
	// Node is the peer's node name.
	Node string `json:"node"`
	// UUID and Index name the peer's GPU.
	UUID  string `json:"uuid"`
	Index int    `json:"index"`
	// XID is the fault's XID: an Unhealthy XID condition of the peer GPU's own, not one its
	// driver said another XID caused.
	XID uint32 `json:"xid"`
	// Since is when the peer's condition began.
	Since time.Time `json:"since"`
}

// Validate reports a PeerFault no agent could have reported.
func (p PeerFault) Validate() error {
	switch {
	case p.Node == "":
		return errors.New("peer fault: no node")
	case p.UUID == "":
		return fmt.Errorf("peer fault of node %s: no GPU UUID", p.Node)
	case p.XID == 0:
		return fmt.Errorf("peer fault of node %s, GPU %s: XID 0", p.Node, p.UUID)
	case p.Since.IsZero():
		return fmt.Errorf("peer fault of node %s, GPU %s: no time", p.Node, p.UUID)
	}
	return nil
}

// maxPeerFaults bounds the peer faults a tracker keeps: an NVL72 rack is 18 nodes of 4 GPUs,
// and a GPU rarely has more than a few XID faults at once. Beyond it the most recent are kept.
const maxPeerFaults = 1024

// SetPeerFaults makes the peer nodes' faults exactly faults (the caller passes the whole set,
// as read from its peers' reports); invalid ones are dropped and returned as errors, and at
// most maxPeerFaults (the most recent) are kept. An XID the driver says an earlier one caused
// is attributed to a peer's fault that began within the policy's RootCauseWindow of it, when
// no GPU of this node had a fault of its own then: Degraded, no eviction, reason
// XID<n>CausedByPeerGPU and a message naming the peer's node and GPU.
//
// A peer's report reaches this node after the XID it caused, often: so the conditions of such
// XIDs already raised (Unhealthy, since no root was known then) are attributed now, when the
// peer's fault began within the window of the XID's last occurrence. An attribution stands
// once made: a peer's fault that clears, or a peer that leaves the domain, brings none back.
func (t *Tracker) SetPeerFaults(faults []PeerFault, now time.Time, out []Transition) ([]Transition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	kept := make([]PeerFault, 0, len(faults))
	for _, f := range faults {
		if err := f.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		f.Since = f.Since.UTC()
		kept = append(kept, f)
	}
	// Most recent first, so that the bound keeps them; the order is stable for equal inputs.
	slices.SortFunc(kept, func(a, b PeerFault) int {
		return cmp.Or(b.Since.Compare(a.Since), cmp.Compare(a.Node, b.Node), cmp.Compare(a.UUID, b.UUID), cmp.Compare(a.XID, b.XID))
	})
	t.peers = kept[:min(len(kept), maxPeerFaults)]
	ev := evaluation{t: t, now: now, out: out}
	if len(t.peers) > 0 {
		for _, ds := range t.ordered {
			ev.attributeToPeers(ds)
		}
	}
	return ev.out, errors.Join(errs...)
}

// attributeToPeers attributes the device's CausedByPrevious XID conditions that no root was
// known for (still at their rule's severity, above Degraded) to a peer's fault, when one began
// within the window of the XID's last occurrence. A fault of this node's GPUs is no candidate:
// one there when the XID came was found then, and one raised after it did not cause it.
func (ev *evaluation) attributeToPeers(ds *deviceState) {
	changed := false
	for i := range ds.conds {
		c := &ds.conds[i]
		if c.Type != ConditionXID || !c.CausedByPrevious || c.Severity <= Degraded {
			continue
		}
		root := ev.rootCause(ds, c.causeXID, c.LastSeen, true)
		if !root.found() {
			continue
		}
		root.attribute(&c.Condition)
		changed = true
	}
	if changed {
		ev.t.generation++
		ev.refresh(ds, ReasonAttributedToPeer)
	}
}

// ReasonAttributedToPeer is the reason of the Transition when a device becomes healthier
// because an XID of its was attributed to a peer node's GPU (Tracker.SetPeerFaults).
const ReasonAttributedToPeer = "AttributedToPeerGPU"
