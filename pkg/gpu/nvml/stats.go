package nvml

import (
	"sync"
	"time"
)

// Stats counts what the backend did, for metrics and for tests. Nothing it sees is dropped
// without being counted here.
type Stats struct {
	// Events is the number of events received from the event set.
	Events uint64 `json:"events"`
	// Unattributed counts events whose GPU could not be identified.
	Unattributed uint64 `json:"unattributed"`
	// WaitErrors counts EventSet.Wait failures other than a timeout, and failures to make the
	// event set anew; each is retried after a backoff.
	WaitErrors uint64 `json:"waitErrors"`
	// ConsecutiveWaitErrors counts the failures since the last successful Wait; Backoff is the
	// delay before the next retry (0 when waiting normally).
	ConsecutiveWaitErrors uint64        `json:"consecutiveWaitErrors"`
	Backoff               time.Duration `json:"backoff"`
	LastWaitError         string        `json:"lastWaitError,omitempty"`
	// EventSetRebuilds counts event sets freed and created anew: after ERROR_UNKNOWN (nvml.h:
	// the set is then undefined), or to leave a lost GPU out.
	EventSetRebuilds uint64 `json:"eventSetRebuilds"`
	// Rounds counts completed sampling rounds; SampleErrors counts readings that failed with
	// anything but NOT_SUPPORTED or GPU_IS_LOST.
	Rounds       uint64 `json:"rounds"`
	SampleErrors uint64 `json:"sampleErrors"`
	// Resets counts GPU resets detected from volatile ECC totals going down or made by
	// CommandResetter.
	Resets uint64 `json:"resets"`
	// Glitches counts readings not believed: out of any physical range, or ECC totals that read
	// lower once and then back.
	Glitches uint64 `json:"glitches"`
	// DriverGone says how the driver went away under the backend, which ended Run ("" while
	// it is there).
	DriverGone string `json:"driverGone,omitempty"`
}

// stats guards Stats.
type stats struct {
	mu sync.Mutex
	s  Stats
}

func (s *stats) add(f func(*Stats)) {
	s.mu.Lock()
	f(&s.s)
	s.mu.Unlock()
}

// Stats returns the backend's counters.
func (b *Backend) Stats() Stats {
	b.stats.mu.Lock()
	defer b.stats.mu.Unlock()
	return b.stats.s
}
