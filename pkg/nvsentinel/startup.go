package nvsentinel

import (
	"maps"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// startupClears are the healthy events a publisher sends once, at its first send: for every
// check, the GPUs without a fault in it. NVSentinel keeps what it was told across gpuhealth's
// restarts, and nothing else tells it that a fault ended while gpuhealth was not running (a
// reboot that NVSentinel itself asked for ends a reboot-class fault, and the new boot's gpuhealth
// finds none). The clears name no error code: they end every code of the check on the GPU. A check
// with no fault on any GPU is cleared with one event that names no GPU, which ends the whole
// check, as NVSentinel's own syslog monitor does after a reboot; one event per check keeps a node
// without faults to a handful of events per start.
type startupClears struct {
	at   time.Time
	gpus []GPU
	// pending are, per check, the UUIDs of the GPUs still to clear.
	pending map[string]map[string]bool
	// scoped are the checks that had a fault in this run: cleared GPU by GPU, never as a whole.
	scoped map[string]bool
}

func newStartupClears(snap health.Snapshot, at time.Time) *startupClears {
	s := &startupClears{at: at, pending: map[string]map[string]bool{}, scoped: map[string]bool{}}
	gpus := GPUs(snap)
	for _, uuid := range slices.Sorted(maps.Keys(gpus)) {
		s.gpus = append(s.gpus, gpus[uuid])
	}
	for _, check := range Checks() {
		s.pending[check] = map[string]bool{}
		for _, g := range s.gpus {
			s.pending[check][g.UUID] = true
		}
	}
	return s
}

// faulty takes the GPUs with a fault out of their checks' clears.
func (s *startupClears) faulty(faults map[Key]stamped) {
	for k := range faults {
		s.scoped[k.Check] = true
		delete(s.pending[k.Check], k.GPU)
	}
}

// items returns the clears still to deliver, check by check.
func (s *startupClears) items(node string) []item {
	var out []item
	for _, check := range Checks() {
		left := s.pending[check]
		if len(left) == 0 {
			continue
		}
		if !s.scoped[check] && len(left) == len(s.gpus) {
			out = append(out, item{stamped: stamped{ev: clearEvent(node, check, nil), at: s.at}, key: Key{Check: check}, clear: true})
			continue
		}
		for _, g := range s.gpus {
			if left[g.UUID] {
				out = append(out, item{stamped: stamped{ev: clearEvent(node, check, g.Entities), at: s.at}, key: Key{GPU: g.UUID, Check: check}, clear: true})
			}
		}
	}
	return out
}

// delivered records that the clear of k arrived.
func (s *startupClears) delivered(k Key) {
	if k.GPU == "" {
		clear(s.pending[k.Check])
		return
	}
	delete(s.pending[k.Check], k.GPU)
}
