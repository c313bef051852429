package health

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// Operators' requests (a clear, a validation) are applied once: the tracker remembers which it
// applied, by a key the caller derives from the request, and the checkpoint keeps that memory,
// so that a request an agent could not remove from the Node (an admission policy that forbids
// it, an API server away, a crash in between) is not applied again by the next process.
const (
	// RequestMemory is how long an applied request is remembered after the time it was
	// written: a request older than that, still on the Node, is applied again. A request
	// only ends conditions that began before it was written, so applying one again changes
	// nothing those conditions' own rules would not.
	RequestMemory = 90 * 24 * time.Hour
	// maxRememberedRequests bounds the memory (and the checkpoint); the oldest go first.
	maxRememberedRequests = 1024
)

// RequestApplied reports whether the request with key was applied (RememberRequest).
func (t *Tracker) RequestApplied(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.requests[key]
	return ok
}

// rememberRequestLocked records that the request with key, written at at, was applied, and
// forgets those written more than RequestMemory before now, and the oldest past
// maxRememberedRequests.
func (t *Tracker) rememberRequestLocked(key string, at, now time.Time) {
	if t.requests == nil {
		t.requests = make(map[string]time.Time)
	}
	t.requests[key] = at
	for k, written := range t.requests {
		if now.Sub(written) > RequestMemory {
			delete(t.requests, k)
		}
	}
	if over := len(t.requests) - maxRememberedRequests; over > 0 {
		keys := slices.SortedFunc(maps.Keys(t.requests), func(a, b string) int {
			if c := t.requests[a].Compare(t.requests[b]); c != 0 {
				return c
			}
			return strings.Compare(a, b)
		})
		for _, k := range keys[:over] {
			delete(t.requests, k)
		}
	}
	t.generation++
}

// RequestApplied reports whether the request with key was applied (see Tracker.RequestApplied).
func (m *Monitor) RequestApplied(key string) bool { return m.tracker.RequestApplied(key) }

// RememberRequest records that the request with key, written at at, was applied, and publishes,
// so that a Runtime saves the checkpoint that keeps it.
func (m *Monitor) RememberRequest(key string, at, now time.Time) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.tracker.mu.Lock()
	m.tracker.rememberRequestLocked(key, at, now)
	m.tracker.mu.Unlock()
	m.publishLocked()
}
