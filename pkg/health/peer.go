package health

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PeerFault is an XID fault another node's agent reports on one of its GPUs, a GPU of the same
// NVLink domain (a GB200 NVL72 rack is one): the driver on this node may log that fault as the
// cause of an XID of its own ("caused by previous Xid 149"), since a GPU's NVLink error reaches
// every GPU it was talking to. Such an XID is then attributed to the peer's GPU, as one caused by
// another GPU of this node is (see Tracker.SetPeerFaults).
//
// A peer fault is a claim another node makes, not a fact this node saw: any node labelled with
// the domain can write one. Validate bounds what it may name, and SetPeerFaults what it may do.
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

// maxNodeName is the longest node name Kubernetes takes (a DNS subdomain, RFC 1123).
const maxNodeName = 253

// Validate reports a PeerFault no agent could have reported: a node name Kubernetes would not
// take, a UUID that is not NVML's "GPU-" and a UUID, a negative index, XID 0 or no time. Its
// errors quote a peer's text only up to a bound, so that no peer can fill this node's log.
func (p PeerFault) Validate() error {
	switch {
	case p.Node == "":
		return errors.New("peer fault: no node")
	case !isNodeName(p.Node):
		return fmt.Errorf("peer fault: %s is no node name", quoteBounded(p.Node))
	case p.UUID == "":
		return fmt.Errorf("peer fault of node %s: no GPU UUID", p.Node)
	case !isGPUUUID(p.UUID):
		return fmt.Errorf("peer fault of node %s: %s is no GPU UUID (GPU- and a UUID)", p.Node, quoteBounded(p.UUID))
	case p.Index < 0:
		return fmt.Errorf("peer fault of node %s, GPU %s: index %d", p.Node, p.UUID, p.Index)
	case p.XID == 0:
		return fmt.Errorf("peer fault of node %s, GPU %s: XID 0", p.Node, p.UUID)
	case p.Since.IsZero():
		return fmt.Errorf("peer fault of node %s, GPU %s: no time", p.Node, p.UUID)
	}
	return nil
}

// isGPUUUID reports whether s is a physical GPU's UUID as NVML writes it: "GPU-" and a UUID
// (GPU-9277d399-0674-44a9-b64e-d85bb19ce2b0). A MIG instance's ("MIG-...") is not one.
func isGPUUUID(s string) bool {
	const prefix = "GPU-"
	if len(s) != len(prefix)+36 || s[:len(prefix)] != prefix {
		return false
	}
	for i, c := range []byte(s[len(prefix):]) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isHexDigit(c) {
				return false
			}
		}
	}
	return true
}

// isNodeName reports whether s is a name Kubernetes gives a Node: a DNS subdomain (RFC 1123) of
// at most maxNodeName bytes, lower-case labels of letters, digits and '-' joined by dots, each
// label starting and ending with a letter or digit.
func isNodeName(s string) bool {
	if len(s) > maxNodeName {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range []byte(label) {
			if !isLabelByte(c) {
				return false
			}
		}
	}
	return true
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// isLabelByte reports whether c may be in a DNS label (RFC 1123): a lower-case letter, a digit
// or '-'.
func isLabelByte(c byte) bool { return 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' }

// maxQuoted bounds how much of a peer's text an error quotes.
const maxQuoted = 64

// quoteBounded quotes s, or its first maxQuoted characters and its length when it is longer.
func quoteBounded(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	return fmt.Sprintf("%.*q... (%d bytes)", maxQuoted, s, len(s))
}

// maxPeerFaults bounds the peer faults a tracker keeps: an NVL72 rack is 18 nodes of 4 GPUs,
// and a GPU rarely has more than a few XID faults at once. Beyond it the most recent are kept.
const maxPeerFaults = 1024

// maxPeerErrors bounds the refused peer faults PeerFaultErrors names; the rest are counted.
const maxPeerErrors = 8

// PeerFaultErrors collects why peer faults were refused: the first few errors, and a count of
// the rest, so that a peer's report of ten thousand bad faults makes one bounded error, not ten
// thousand lines. The zero value is ready to use.
type PeerFaultErrors struct {
	errs []error
	more int
}

// Add records one refusal.
func (e *PeerFaultErrors) Add(err error) {
	if len(e.errs) < maxPeerErrors {
		e.errs = append(e.errs, err)
		return
	}
	e.more++
}

// Err joins the refusals recorded (nil when none), naming the first few and counting the rest.
func (e *PeerFaultErrors) Err() error {
	if e.more > 0 {
		return errors.Join(append(slices.Clip(e.errs), fmt.Errorf("and %d more refused peer faults", e.more))...)
	}
	return errors.Join(e.errs...)
}

// SetPeerFaults makes the peer nodes' faults exactly faults (the caller passes the whole set,
// as read from its peers' reports); invalid ones are dropped and returned as errors (the first
// few named, the rest counted), and at most maxPeerFaults (the most recent) are kept.
//
// An XID the driver says an earlier one caused is attributed to a peer's fault of the XID the
// driver named, that began within the policy's RootCauseWindow of the XID's last occurrence,
// when no GPU of this node had a fault of its own then: Degraded, no eviction, reason
// XID<n>CausedByPeerGPU and a message naming the peer's node and GPU. An XID whose driver
// named no cause is never a peer's: any peer fault would do, a forged one too.
//
// The attribution holds while the set does: a peer's report often reaches this node after the
// XID it caused, so XIDs already raised are attributed when it comes; and when the fault leaves
// the set (the peer cleared it, took back a forged one, or left the domain), the XID is
// attributed to another fault of the set that explains it, or is its GPU's own again, under its
// rule's severity and eviction. An attribution restored from a checkpoint, whose named XID the
// checkpoint does not keep, holds only while a fault of the set is the one its message names.
func (t *Tracker) SetPeerFaults(faults []PeerFault, now time.Time, out []Transition) ([]Transition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var refused PeerFaultErrors
	kept := make([]PeerFault, 0, len(faults))
	for _, f := range faults {
		if err := f.Validate(); err != nil {
			refused.Add(err)
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
	for _, ds := range t.ordered {
		ev.judgeAgainstPeers(ds)
	}
	return ev.out, refused.Err()
}

// judgeAgainstPeers judges the device's CausedByPrevious XID conditions that a peer's fault
// could explain against the peers' faults: those attributed to a peer, and those no root was
// known for (still at their rule's severity, above Degraded). A fault of this node's GPUs is no
// candidate: one there when the XID came was found then, and one raised after it did not cause
// it.
func (ev *evaluation) judgeAgainstPeers(ds *deviceState) {
	for i := 0; i < len(ds.conds); i++ {
		c := &ds.conds[i]
		if c.Type != ConditionXID || !c.CausedByPrevious {
			continue
		}
		attributed := AttributedToPeer(c.Condition)
		if !attributed && c.Severity <= Degraded {
			continue
		}
		if attributed && c.causeXID == 0 {
			c.causeXID = ev.t.restoredCause(c.Condition)
		}
		root := ev.rootCause(ds, c.causeXID, c.LastSeen, true)
		switch {
		case root.found() && attributed:
			ev.reattribute(ds, i, root)
		case root.found():
			root.attribute(&c.Condition)
			ev.t.generation++
			ev.refresh(ds, ReasonAttributedToPeer)
		case attributed:
			if ev.withdraw(ds, i) {
				i-- // the condition ended: the next one took its place
			}
		}
	}
}

// restoredCause is the XID a peer-attributed condition restored from a checkpoint was caused
// by: the XID of the peer fault its message names (an attribution names a fault of the XID the
// driver named), or zero when none of the set is that fault.
func (t *Tracker) restoredCause(c Condition) uint32 {
	for i := range t.peers {
		if p := &t.peers[i]; strings.HasSuffix(c.Message, p.causeText()) {
			return p.XID
		}
	}
	return 0
}

// reattribute points the device's i-th condition, attributed to a peer's fault, at root, when
// root is another fault: its health stays, its message names the fault that explains it now.
func (ev *evaluation) reattribute(ds *deviceState, i int, root rootFault) {
	c := &ds.conds[i]
	want := ev.xidCondition(c.Code, c.flags, c.causeXID, root)
	if want.Message == c.Message {
		return
	}
	c.Message = want.Message
	ev.t.generation++
}

// withdraw makes the device's i-th condition, attributed to a peer's fault no longer reported,
// its GPU's own again under its rule: Since and LastSeen stay (a withdrawal is no new sighting),
// and a fault is recorded in the GPU's history if it is now Unhealthy. A rule that raises no
// condition for the XID (a policy changed across a restart) ends it; withdraw then reports
// true.
func (ev *evaluation) withdraw(ds *deviceState, i int) (ended bool) {
	c := &ds.conds[i]
	rule, _ := ev.t.policy.XIDRuleFor(c.Code)
	if rule.FollowRecoveryAction || rule.Severity == Healthy {
		ev.removeAt(ds, i, ReasonPeerFaultWithdrawn)
		return true
	}
	own := ev.xidCondition(c.Code, c.flags, c.causeXID, rootFault{})
	own.Since, own.LastSeen = c.Since, c.LastSeen
	*c = own
	ev.t.generation++
	ev.refresh(ds, ReasonPeerFaultWithdrawn)
	if c.Severity == Unhealthy && sticky(c.Condition) {
		gpu := ds
		if ds.parent != nil {
			gpu = ds.parent
		}
		ev.fault(gpu, c.Condition)
	}
	return false
}

// causeText is how an attribution to the fault reads at the end of a condition's message. Every
// part is bounded (Validate): a UUID has a fixed length, a node name at most maxNodeName bytes.
func (p *PeerFault) causeText() string {
	return fmt.Sprintf(", caused by XID %d on GPU %d (%s) of node %s", p.XID, p.Index, p.UUID, p.Node)
}

// AttributedToPeer reports whether c is an XID condition attributed to a peer node's fault
// (Tracker.SetPeerFaults): one that holds only while the peer reports the fault, so a caller
// that feeds the peers' faults keeps reading them while it is in effect.
func AttributedToPeer(c Condition) bool {
	return c.Type == ConditionXID && c.CausedByPrevious && c.Reason == peerReason(c.Code)
}

// peerReason is the reason of an XID condition attributed to a peer's fault; a reason cannot
// hold the peer's node.
func peerReason(xid uint32) string { return fmt.Sprintf("XID%dCausedByPeerGPU", xid) }

// Reasons of the Transitions SetPeerFaults causes when a device becomes healthier.
const (
	// ReasonAttributedToPeer: an XID of the device was attributed to a peer node's GPU.
	ReasonAttributedToPeer = "AttributedToPeerGPU"
	// ReasonPeerFaultWithdrawn: the peer fault an XID was attributed to is no longer reported,
	// and the XID's own rule raises no condition for it.
	ReasonPeerFaultWithdrawn = "PeerFaultWithdrawn"
)
