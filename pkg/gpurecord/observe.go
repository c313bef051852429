package gpurecord

import (
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LastSeenEvery is how often a placement's LastSeen moves: a report that only says the GPU is
// still there changes the record at most this often, so that a node's reports do not rewrite
// the records of its GPUs.
const LastSeenEvery = time.Hour

// Observation is what one node's report says of one GPU with a serial.
type Observation struct {
	Node  string
	Index int
	UUID  string
	Model string
	// Events are what the report says happened to the GPU (Node and Index set), in any order.
	Events []Event
}

// HasEvents reports whether o has something to remember: a GPU without a record gets one only
// then.
func (o Observation) HasEvents() bool { return len(o.Events) > 0 }

// Observe merges o, seen at now, into r and reports whether r changed. Events r already has are
// not counted again; an event older than all of a full record's is taken as one it dropped.
// Times are kept to the second, as the API server stores them (RFC 3339), so that an event read
// back from the server is the event reported again.
func Observe(r *GPURecord, o Observation, now time.Time) bool {
	now = now.Truncate(time.Second)
	changed := false
	if o.Model != "" && r.Model != o.Model {
		r.Model, changed = o.Model, true
	}
	if place(r, o, now) {
		changed = true
	}
	for _, e := range o.Events {
		e.Time = metav1.NewTime(e.Time.Truncate(time.Second))
		if addEvent(r, e) {
			changed = true
		}
	}
	return changed
}

// place records that the GPU is in o's node.
func place(r *GPURecord, o Observation, now time.Time) bool {
	i := slices.IndexFunc(r.Placements, func(p Placement) bool { return p.Node == o.Node && p.UUID == o.UUID })
	if i >= 0 {
		p := &r.Placements[i]
		if p.Index == o.Index && now.Sub(p.LastSeen.Time) < LastSeenEvery {
			return false
		}
		p.Index, p.LastSeen = o.Index, metav1.NewTime(now)
		return true
	}
	if len(r.Placements) >= MaxPlacements {
		oldest := 0
		for j, p := range r.Placements {
			if p.LastSeen.Before(&r.Placements[oldest].LastSeen) {
				oldest = j
			}
		}
		r.Placements = slices.Delete(r.Placements, oldest, oldest+1)
	}
	t := metav1.NewTime(now)
	r.Placements = append(r.Placements, Placement{Node: o.Node, Index: o.Index, UUID: o.UUID, FirstSeen: t, LastSeen: t})
	return true
}

// addEvent inserts e in time order unless r has it, dropping the oldest beyond MaxEvents.
func addEvent(r *GPURecord, e Event) bool {
	if slices.ContainsFunc(r.Events, e.same) || e.Kind == EventReplaceGPU && escalated(r, e.Node) {
		return false
	}
	if len(r.Events) >= MaxEvents && e.Time.Before(&r.Events[0].Time) {
		return false
	}
	at, _ := slices.BinarySearchFunc(r.Events, e, func(a, b Event) int { return a.Time.Compare(b.Time.Time) })
	r.Events = slices.Insert(r.Events, at, e)
	if len(r.Events) > MaxEvents {
		r.Events = slices.Delete(r.Events, 0, len(r.Events)-MaxEvents)
	}
	if r.Counts == nil {
		r.Counts = map[EventKind]int{}
	}
	r.Counts[e.Kind]++
	return true
}

// escalated reports whether r has an escalation to ReplaceGPU on node that no EventCleared on
// node followed: the agent reports one escalation for as long as it lasts, and the time it gives
// is its worst condition's, which may change.
func escalated(r *GPURecord, node string) bool {
	for i := len(r.Events) - 1; i >= 0; i-- {
		e := r.Events[i]
		if e.Node != node {
			continue
		}
		switch e.Kind {
		case EventCleared:
			return false
		case EventReplaceGPU:
			return true
		}
	}
	return false
}
