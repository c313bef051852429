package report

import (
	"math/rand/v2"
	"time"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// Heartbeat says when a reporter that carries the node's heartbeat (gpuhealthv1.HeartbeatKey)
// must confirm its report although nothing changed. One reporter carries it (the agent picks the
// condition reporter, else the annotation reporter), so that a node costs one write per period.
type Heartbeat struct {
	// Period between heartbeats; 0 turns them off.
	Period time.Duration
	// Late is added to every period: NewHeartbeat picks it at random (up to a quarter of the
	// period, and at least the second the value's precision loses), so that agents whose
	// heartbeats fell together (started together, or all retrying once an API server outage
	// ends) spread over a quarter of the period afterwards instead of writing in the same
	// second of every period (5,000 nodes: about 67 writes/s instead of a burst), and no node
	// writes more often than once a period.
	Late time.Duration
}

// NewHeartbeat returns a Heartbeat of period with a random Late.
func NewHeartbeat(period time.Duration) Heartbeat {
	if period <= 0 {
		return Heartbeat{}
	}
	return Heartbeat{Period: period, Late: time.Second + rand.N(period/4+1)}
}

// Due reports whether a heartbeat must be written at now, given the node's current value of
// HeartbeatKey: none, an unreadable one, one a period (and Late) old, or one more than a period
// ahead of this clock (which readers take for stale, and which would otherwise stand until then).
func (h Heartbeat) Due(current string, now time.Time) bool {
	if h.Period <= 0 {
		return false
	}
	t, err := gpuhealthv1.ParseHeartbeat(current)
	return err != nil || !now.Before(t.Add(h.Period+h.Late)) || t.Sub(now) > h.Period
}

// Next is when the heartbeat after the one valued current is due (zero: off, or due at once).
func (h Heartbeat) Next(current string) time.Time {
	if h.Period <= 0 {
		return time.Time{}
	}
	t, err := gpuhealthv1.ParseHeartbeat(current)
	if err != nil {
		return time.Time{}
	}
	return t.Add(h.Period + h.Late)
}
