package simdriver

import (
	"context"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// The scenario's timeline: its events applied at their time on the simulator's clock.

// applyAtStart applies the scenario's events at 0s, before the simulator serves, and returns
// the rest, with the afterReset events of a GPU reset at 0s in their place.
func (s *server) applyAtStart(sc *sim.Scenario) []sim.Event {
	pending := slices.Clone(sc.Events)
	for len(pending) > 0 && pending[0].At <= 0 {
		_ = s.node.apply(pending[0]) // nobody holds the driver before it serves
		if pending[0].Kind == sim.EventReset {
			pending = afterReset(pending[1:], sc, pending[0].GPU, 0)
			continue
		}
		pending = pending[1:]
	}
	return pending
}

// timeline applies the scenario's events at their time from now, and each GPU's afterReset
// events after every reset of it.
func (s *server) timeline(ctx context.Context, sc *sim.Scenario, pending []sim.Event) {
	start := s.clock.Now()
	for len(pending) > 0 {
		ev := pending[0]
		pending = pending[1:]
		if !s.sleep(ctx, start.Add(ev.At).Sub(s.clock.Now())) {
			return
		}
		if ev.Kind == sim.EventReset {
			if s.applyReset(ev) {
				pending = afterReset(pending, sc, ev.GPU, ev.At)
			}
			continue
		}
		if !s.applyRetrying(ctx, ev) {
			return
		}
	}
}

// applyReset applies a timeline reset. While a process holds NVML it is refused, as `nvidia-smi
// --gpu-reset` refuses a GPU another process has open, and logged: the scenario's afterReset
// events do not follow a reset that did not happen. It reports whether the GPU was reset.
func (s *server) applyReset(ev sim.Event) bool {
	s.node.mu.Lock()
	err := s.node.apply(ev)
	s.node.mu.Unlock()
	if err != nil {
		s.log.Info("GPU reset refused", "line", ev.Line, "gpu", ev.GPU, "reason", err.Error())
		return false
	}
	return true
}

// applyRetrying applies a timeline event; an unload that processes hold is tried again every
// second until they let go, as the GPU operator's driver manager keeps trying to unload the
// module. It returns false when ctx ends first.
func (s *server) applyRetrying(ctx context.Context, ev sim.Event) bool {
	said := false
	for {
		s.node.mu.Lock()
		err := s.node.apply(ev)
		s.node.mu.Unlock()
		if err == nil {
			return true
		}
		if !said {
			s.log.Info("Driver unload refused; trying again every second", "line", ev.Line, "reason", err.Error())
			said = true
		}
		if !s.sleep(ctx, time.Second) {
			return false
		}
	}
}

func afterReset(events []sim.Event, sc *sim.Scenario, gpu int, at time.Duration) []sim.Event {
	for _, ev := range sc.AfterReset {
		if ev.GPU != gpu {
			continue
		}
		ev.At += at
		i := 0
		for i < len(events) && events[i].At <= ev.At {
			i++
		}
		events = append(events[:i], append([]sim.Event{ev}, events[i:]...)...)
	}
	return events
}

// sleep waits d on the timeline's clock; it returns false when ctx ends first.
func (s *server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-s.clock.After(d):
		return true
	case <-ctx.Done():
		return false
	}
}
