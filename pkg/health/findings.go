package health

import (
	"fmt"
	"slices"
	"time"
)

// Node findings: what the node-scoped repeat rules (RepeatRule.NodeScoped) find about the node as
// a whole, kept by the Tracker beside the GPUs' conditions, raised, seen again and expired here.

// NodeFinding is something about the node as a whole that no single GPU carries: an XID spread
// over several GPUs points at software, not at a card. It changes no GPU's health.
type NodeFinding struct {
	// Reason is the rule's name.
	Reason   string    `json:"reason"`
	Message  string    `json:"message"`
	Since    time.Time `json:"since"`
	LastSeen time.Time `json:"lastSeen"`
	// GPUs are the UUIDs of the GPUs that saw the XIDs within the window, sorted.
	GPUs []string `json:"gpus"`
}

// spread re-evaluates node rule i after one of its XIDs was counted: the finding is raised, or
// seen again, while GPUs distinct GPUs saw its XIDs within the window. Seeing a finding again
// with the same GPUs allocates nothing, so a flood costs no garbage.
func (ev *evaluation) spread(i int, r *RepeatRule) {
	t := ev.t
	n := t.spreadCount(i, r, ev.now)
	if n < r.GPUs {
		return // expiry (expireFindings) ends a finding; a new occurrence never does
	}
	f := t.findFinding(r.Name)
	if f >= 0 {
		nf := &t.findings[f]
		nf.LastSeen = ev.now
		t.findingSeen(ev.now, r.Window)
		if len(nf.GPUs) == n && t.allInWindow(i, r, ev.now, nf.GPUs) {
			return
		}
		nf.GPUs = t.spreadGPUs(i, r, ev.now)
		nf.Message = spreadMessage(r, nf.GPUs)
		t.generation++
		return
	}
	gpus := t.spreadGPUs(i, r, ev.now)
	t.findings = append(t.findings, NodeFinding{
		Reason: r.Name, Message: spreadMessage(r, gpus), Since: ev.now, LastSeen: ev.now, GPUs: gpus,
	})
	t.findingSeen(ev.now, r.Window)
	t.generation++
}

// findingSeen keeps findingsSettled no later than the end of the window of a finding seen at now
// (now may be earlier than an earlier signal's time: clocks jump).
func (t *Tracker) findingSeen(now time.Time, window time.Duration) {
	if until := now.Add(window); until.Before(t.findingsSettled) {
		t.findingsSettled = until
	}
}

// allInWindow reports whether every GPU of uuids saw rule i within its window.
func (t *Tracker) allInWindow(i int, r *RepeatRule, now time.Time, uuids []string) bool {
	for _, u := range uuids {
		ds, ok := t.devices[u]
		if !ok || !ds.inWindow(i, r, now) {
			return false
		}
	}
	return true
}

// spreadCount counts the GPUs whose last occurrence of node rule i is within its window.
func (t *Tracker) spreadCount(i int, r *RepeatRule, now time.Time) int {
	n := 0
	for _, ds := range t.ordered {
		if ds.inWindow(i, r, now) {
			n++
		}
	}
	return n
}

func spreadMessage(r *RepeatRule, gpus []string) string {
	return fmt.Sprintf("XID %s seen on %d GPUs within %v: %s", r.XIDList(), len(gpus), r.Window, r.Description)
}

// spreadGPUs returns, sorted, the GPUs whose last occurrence of node rule i is within its
// window of now.
func (t *Tracker) spreadGPUs(i int, r *RepeatRule, now time.Time) []string {
	var gpus []string
	for _, ds := range t.ordered {
		if ds.inWindow(i, r, now) {
			gpus = append(gpus, ds.dev.UUID)
		}
	}
	slices.Sort(gpus)
	return gpus
}

// inWindow reports whether the device is a physical GPU whose last occurrence of rule i lies
// within the rule's window of now.
func (ds *deviceState) inWindow(i int, r *RepeatRule, now time.Time) bool {
	if ds.parent != nil || ds.repeats == nil || !ds.repeats[i].seen {
		return false
	}
	age := now.UnixNano() - ds.repeats[i].last
	return age >= 0 && age <= int64(r.Window)
}

func (t *Tracker) findFinding(reason string) int {
	for i := range t.findings {
		if t.findings[i].Reason == reason {
			return i
		}
	}
	return -1
}

// expireFindings ends the node findings of spread rules that no longer hold as of now: fewer
// than the rule's GPUs saw its XIDs within the window. Until findingsSettled none can, and it
// returns at once: a flood that keeps a finding alive pays one comparison per signal.
func (t *Tracker) expireFindings(now time.Time) {
	if len(t.findings) == 0 || !now.After(t.findingsSettled) {
		return
	}
	before := len(t.findings)
	settled := now.Add(maxDuration) // no finding of a rule left: nothing to expire
	t.findings = slices.DeleteFunc(t.findings, func(f NodeFinding) bool {
		i, r := t.spreadRule(f.Reason)
		if r == nil {
			return false // not a rule's (GPUsMissing): it lasts as long as its cause
		}
		if now.Sub(f.LastSeen) > r.Window && t.spreadCount(i, r, now) < r.GPUs {
			return true
		}
		// Kept: it can end once its window has passed (at once, if it has and GPUs still
		// see the XIDs: each call looks again).
		settled = minTime(settled, f.LastSeen.Add(r.Window))
		return false
	})
	t.findingsSettled = settled
	if len(t.findings) != before {
		t.generation++
	}
}

// findingsUnsettled makes the next expireFindings look at every finding.
func (t *Tracker) findingsUnsettled() { t.findingsSettled = time.Time{} }

// spreadRule returns the node rule named reason and its place in the policy, or nil.
func (t *Tracker) spreadRule(reason string) (int, *RepeatRule) {
	for i := range t.policy.Repeats {
		if r := &t.policy.Repeats[i]; r.Name == reason && r.NodeScoped() {
			return i, r
		}
	}
	return -1, nil
}

// maxDuration is the longest time.Duration.
const maxDuration = time.Duration(1<<63 - 1)

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
