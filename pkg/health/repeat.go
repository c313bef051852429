package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RepeatRule judges an XID by how often it comes back rather than by one occurrence. A rule
// either watches one GPU (the XID repeats on the same GPU within Window: a likely hardware
// fault, which raises a condition of its own) or the node (the XID shows up on GPUs distinct
// GPUs within Window: a likely software cause, such as a bad driver, a bad CUDA image or a job
// that fails everywhere, which raises a NodeFinding and makes no GPU less healthy).
//
// Occurrences are counted on the physical GPU: an XID of a MIG instance counts for its GPU.
type RepeatRule struct {
	// Name is the reason of the condition or finding the rule raises; unique in a Policy.
	Name string
	// XIDs are the XIDs the rule counts, together.
	XIDs []uint32
	// Count is how many occurrences on one GPU within Window raise the condition (same-GPU
	// rules; at least 2).
	Count int
	// GPUs is how many distinct GPUs of the node, each seeing one of the XIDs within Window,
	// raise the finding (node rules; at least 2). A rule sets Count or GPUs, not both.
	GPUs int
	// Window is the span the occurrences must fall in.
	Window time.Duration
	// Burst folds occurrences closer than this to the last counted one into it: the driver
	// logs one fault several times, and a flood must count as one event, not thousands. Zero
	// counts every occurrence.
	Burst time.Duration
	// Severity, ClearsOn, Evict and Action make the condition of a same-GPU rule. A node rule
	// uses none of them: its finding ends once fewer than GPUs GPUs saw the XIDs within Window.
	Severity Severity
	ClearsOn ClearsOn
	Evict    bool
	Action   Action
	// Description says what the repetition means, for messages.
	Description string
	// Source names where the rule comes from (a peer's rule, a catalog entry), for the docs.
	Source string
}

// NodeScoped reports whether the rule watches the node (distinct GPUs) rather than one GPU.
func (r *RepeatRule) NodeScoped() bool { return r.GPUs > 0 }

// Matches reports whether the rule counts xid.
func (r *RepeatRule) Matches(xid uint32) bool { return slices.Contains(r.XIDs, xid) }

// XIDList formats the rule's XIDs for messages ("13", "13/31").
func (r *RepeatRule) XIDList() string {
	var b strings.Builder
	for i, x := range r.XIDs {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(strconv.FormatUint(uint64(x), 10))
	}
	return b.String()
}

// Validate reports what makes the rule unusable.
func (r *RepeatRule) Validate() error {
	switch {
	case r.Name == "":
		return fmt.Errorf("name: required")
	case len(r.XIDs) == 0:
		return fmt.Errorf("xids: required")
	case r.Count > 0 && r.GPUs > 0:
		return fmt.Errorf("set count (same GPU) or gpus (spread over the node), not both")
	case r.Count == 0 && r.GPUs == 0:
		return fmt.Errorf("set count (same GPU) or gpus (spread over the node)")
	case r.Count != 0 && (r.Count < 2 || r.Count > MaxRepeatCount):
		return fmt.Errorf("count: must be from 2 to %d, got %d", MaxRepeatCount, r.Count)
	case r.GPUs != 0 && (r.GPUs < 2 || r.GPUs > maxRepeatGPUs):
		return fmt.Errorf("gpus: must be from 2 to %d, got %d", maxRepeatGPUs, r.GPUs)
	case r.Window <= 0:
		return fmt.Errorf("window: must be positive, got %v", r.Window)
	case r.Burst < 0 || r.Burst >= r.Window:
		return fmt.Errorf("burst: must be zero or positive and shorter than the window (%v), got %v", r.Window, r.Burst)
	case !r.NodeScoped() && r.Severity == Healthy:
		return fmt.Errorf("severity: a same-GPU rule must raise Degraded or Unhealthy")
	}
	return nil
}

// Limits on repeat rules: they bound the memory a rule costs per GPU.
const (
	MaxRepeatCount = 100
	maxRepeatGPUs  = 1024
	// MaxRepeatRules bounds the rules of a policy.
	MaxRepeatRules = 64
)

// ConditionXIDRepeat is the condition a same-GPU repeat rule raises; Code tells rules apart (the
// rule's place in Policy.Repeats, from 1) and Reason is the rule's name.
const ConditionXIDRepeat ConditionType = "XIDRepeat"

// repeatState is one rule's memory on one GPU: the times of the last Count counted occurrences
// (a ring), and of the last one.
type repeatState struct {
	times []int64 // UnixNano, a ring of up to Count entries; nil for node rules
	head  int     // where the next time goes
	n     int     // how many entries hold a time
	last  int64   // the last counted occurrence, when seen
	seen  bool    // whether any occurrence was counted
}

// count records an occurrence at now unless it falls in the burst of the last one, and reports
// whether it counted.
func (s *repeatState) count(r *RepeatRule, now int64) bool {
	if s.seen && now >= s.last && now-s.last < int64(r.Burst) {
		return false
	}
	s.last, s.seen = now, true
	if r.NodeScoped() {
		return true
	}
	if s.times == nil {
		s.times = make([]int64, r.Count)
	}
	s.times[s.head] = now
	s.head = (s.head + 1) % len(s.times)
	s.n = min(s.n+1, len(s.times))
	return true
}

// full reports whether the last Count occurrences fall within the rule's window.
func (s *repeatState) full(r *RepeatRule) bool {
	if s.n < len(s.times) || len(s.times) == 0 {
		return false
	}
	newest := s.times[(s.head+len(s.times)-1)%len(s.times)]
	oldest := s.times[s.head]
	return newest-oldest <= int64(r.Window)
}

// repeats counts an XID against the policy's repeat rules on the physical GPU gpu.
func (ev *evaluation) repeats(gpu *deviceState, xid uint32) {
	rules := ev.t.policy.Repeats
	if len(rules) == 0 {
		return
	}
	now := ev.now.UnixNano()
	for i := range rules {
		r := &rules[i]
		if !r.Matches(xid) {
			continue
		}
		if gpu.repeats == nil {
			gpu.repeats = make([]repeatState, len(rules))
		}
		if !gpu.repeats[i].count(r, now) {
			continue
		}
		if r.NodeScoped() {
			ev.spread(i, r)
			continue
		}
		if !gpu.repeats[i].full(r) {
			continue
		}
		ev.raise(gpu, raiseSpec{
			Type: ConditionXIDRepeat, Code: uint32(i + 1), Severity: r.Severity, ClearsOn: r.ClearsOn,
			Evict: r.Evict, RecommendedAction: r.Action, Reason: r.Name,
		}, func() string {
			return fmt.Sprintf("XID %s seen %d times within %v on this GPU: %s", r.XIDList(), r.Count, r.Window, r.Description)
		})
	}
}
