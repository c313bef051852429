package v1

import (
	"fmt"
	"hash/fnv"
	"time"
)

// HeartbeatKey is the Node annotation that says when the node's agent last confirmed its report:
// an RFC 3339 time, UTC, whole seconds. The agent refreshes it at its heartbeat period
// (agent.heartbeat, default DefaultHeartbeat) even when nothing changed, in the same write as
// the GPUUnhealthy condition's lastHeartbeatTime when that condition is reported. A report whose
// heartbeat is older than a reader's staleness bound (a few periods: DefaultStaleAfter) is from an
// agent that stopped: its "healthy" means nothing. A node without the key has an agent that
// predates heartbeats (or none), and readers judge it as before.
const HeartbeatKey = "gpuhealth.dev/gpu-health-heartbeat"

// DefaultHeartbeat is the agent's default heartbeat period; DefaultStaleAfter is how old a
// heartbeat readers (the extender, the breaker controller, `gpuhealth status`) accept by default:
// three periods, so that one lost write or a slow API server does not make a node stale.
const (
	DefaultHeartbeat  = 5 * time.Minute
	DefaultStaleAfter = StaleAfterPeriods * DefaultHeartbeat
	// StaleAfterPeriods is how many heartbeat periods readers wait by default.
	StaleAfterPeriods = 3
)

// FormatHeartbeat is HeartbeatKey's value for t.
func FormatHeartbeat(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

// ParseHeartbeat decodes HeartbeatKey's value.
func ParseHeartbeat(value string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, value)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", HeartbeatKey, err)
	}
	return t, nil
}

// Staleness is what a reader makes of a node's heartbeat at some time.
type Staleness struct {
	// Heartbeat is the node's last heartbeat (zero: none, or unreadable).
	Heartbeat time.Time
	// Stale: the heartbeat is older than the reader's bound, or unreadable. A node without
	// the key is never stale.
	Stale bool
	// Err says why an unreadable heartbeat counts as stale.
	Err error
	// Future: the heartbeat is further ahead of the reader's clock than the bound (a node clock
	// far ahead, or a value written by hand): taken as stale, since it would otherwise keep an
	// agent that stopped fresh until that time.
	Future bool
}

// JudgeHeartbeat judges a node's annotations at now: stale when its heartbeat is older than
// staleAfter (0 turns the judgement off), cannot be read (a garbage value must not pass for a
// live agent), or is more than staleAfter in the future (HeartbeatStale).
func JudgeHeartbeat(annotations map[string]string, now time.Time, staleAfter time.Duration) Staleness {
	v, ok := annotations[HeartbeatKey]
	if !ok || staleAfter <= 0 {
		return Staleness{}
	}
	t, err := ParseHeartbeat(v)
	if err != nil {
		return Staleness{Stale: true, Err: err}
	}
	stale, future := HeartbeatStale(t, now, staleAfter)
	return Staleness{Heartbeat: t, Stale: stale, Future: future}
}

// HeartbeatStale judges one heartbeat at now: stale when it is more than staleAfter old, or more
// than staleAfter ahead of now (future). A heartbeat a little ahead (clocks that differ by less
// than the bound) is fresh.
func HeartbeatStale(t, now time.Time, staleAfter time.Duration) (stale, future bool) {
	if t.Sub(now) > staleAfter {
		return true, true
	}
	return now.Sub(t) > staleAfter, false
}

// Age is how long ago the heartbeat was at now (0 without one).
func (s Staleness) Age(now time.Time) time.Duration {
	if s.Heartbeat.IsZero() {
		return 0
	}
	return max(now.Sub(s.Heartbeat), 0)
}

// Describe describes a stale heartbeat for a message: "stale since <time> (<age> ago)".
func (s Staleness) Describe(now time.Time) string {
	if s.Err != nil {
		return "stale: unreadable heartbeat (" + s.Err.Error() + ")"
	}
	if s.Future {
		return fmt.Sprintf("stale: heartbeat in the future (%s, %s ahead of this clock)", s.Heartbeat.UTC().Format(time.RFC3339), s.Heartbeat.Sub(now).Truncate(time.Second))
	}
	return fmt.Sprintf("stale since %s (%s ago)", s.Heartbeat.UTC().Format(time.RFC3339), s.Age(now).Truncate(time.Second))
}

// Since this release the heartbeat is a Lease, not a Node write: each agent renews a Lease of
// its own (coordination.k8s.io/v1, in the chart's namespace, named HeartbeatLeaseName(node),
// labelled HeartbeatLeaseLabel, spec.holderIdentity the node's name, spec.renewTime the
// heartbeat) every agent.heartbeat, and writes its Node only when its GPUs' health changes.
// Readers take the Lease when there is one and fall back to HeartbeatKey for an agent of an
// earlier release (internal/heartbeat's Judge); that fallback goes in the next release.
const (
	// HeartbeatLeaseLabel marks the agents' heartbeat Leases (value "true"), so readers list
	// and watch only those.
	HeartbeatLeaseLabel = "gpuhealth.dev/agent-heartbeat"
	// heartbeatLeasePrefix starts every heartbeat Lease's name.
	heartbeatLeasePrefix = "gpuhealth-heartbeat-"
	// maxLeaseName is the longest object name (a DNS subdomain).
	maxLeaseName = 253
)

// HeartbeatLeaseName is the name of the heartbeat Lease of node's agent: the prefix and the
// node's name (a node name is a DNS subdomain, so the Lease's is too), or, for a node name too
// long to carry whole, the prefix and a hash of it.
func HeartbeatLeaseName(node string) string {
	if len(heartbeatLeasePrefix)+len(node) <= maxLeaseName {
		return heartbeatLeasePrefix + node
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	return fmt.Sprintf("%s%016x", heartbeatLeasePrefix, h.Sum64())
}

// JudgeHeartbeatTime judges a heartbeat known to exist (an agent's Lease) renewed at t, at now:
// zero (never renewed by that node's agent) is stale, else as HeartbeatStale says.
func JudgeHeartbeatTime(t, now time.Time, staleAfter time.Duration) Staleness {
	if staleAfter <= 0 {
		return Staleness{}
	}
	if t.IsZero() {
		return Staleness{Stale: true, Err: fmt.Errorf("the heartbeat Lease is not renewed by the node's agent")}
	}
	stale, future := HeartbeatStale(t, now, staleAfter)
	return Staleness{Heartbeat: t, Stale: stale, Future: future}
}
