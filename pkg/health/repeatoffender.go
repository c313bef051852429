package health

import (
	"fmt"
	"time"
)

// A repeat offender is a GPU whose past, kept cluster-side by its board serial, meets the
// operator's rule (package gpurecord's RepeatOffenderRule): it failed on other nodes, or on this
// one before it was re-imaged. The agent learns it from that record when the GPU appears and
// marks it here; only an administrator's clear ends it.
const (
	// ConditionRepeatOffender is Degraded: people should look at the card before trusting it
	// with long jobs, and schedulers may keep placing work.
	ConditionRepeatOffender ConditionType = "RepeatOffender"
	// ReasonRepeatOffender is its reason.
	ReasonRepeatOffender = "RepeatOffender"
)

// MarkRepeatOffender raises ConditionRepeatOffender on physical GPU uuid, with message naming
// its past; marking it again replaces the message.
func (t *Tracker) MarkRepeatOffender(uuid, message string, now time.Time, out []Transition) ([]Transition, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ds, ok := t.devices[uuid]
	if !ok {
		return out, fmt.Errorf("%w %q", ErrUnknownDevice, uuid)
	}
	if ds.parent != nil {
		return out, fmt.Errorf("repeat offender %q: a MIG instance has no past of its own", uuid)
	}
	ev := evaluation{t: t, now: now, out: out}
	ev.replace(ds, condState{Condition: Condition{
		Type: ConditionRepeatOffender, Severity: Degraded, ClearsOn: ClearsOnAdmin,
		RecommendedAction: ActionInspect, Reason: ReasonRepeatOffender, Message: message,
	}})
	return ev.out, nil
}

// MarkRepeatOffender raises ConditionRepeatOffender (see Tracker.MarkRepeatOffender) and
// publishes the result.
func (m *Monitor) MarkRepeatOffender(uuid, message string, now time.Time) error {
	m.feed.Lock()
	defer m.feed.Unlock()
	var err error
	m.buf, err = m.tracker.MarkRepeatOffender(uuid, message, now, m.buf[:0])
	m.publishLocked()
	return err
}
