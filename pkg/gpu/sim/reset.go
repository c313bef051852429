package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
)

// Resetting a simulated GPU on request (Backend.Reset, as nvidia-smi --gpu-reset): the Run loop
// serves the request, and the scenario's afterReset events for the GPU follow.

// resetRequest asks the Run loop to reset a GPU; done (buffered) gets the result.
type resetRequest struct {
	uuid string
	done chan error
}

// Reset resets a simulated GPU now, as nvidia-smi --gpu-reset would: the GPU's readings return
// to those of a freshly reset GPU and the backend reports health.SignalReset. A lost GPU cannot
// be reset, nor can a MIG instance on its own. The scenario's afterReset events for the GPU
// follow. Reset needs Run to be running.
func (b *Backend) Reset(ctx context.Context, uuid string) error {
	req := resetRequest{uuid: uuid, done: make(chan error, 1)}
	select {
	case b.resets <- req:
	case <-ctx.Done():
		return fmt.Errorf("reset %s: %w", uuid, ctx.Err())
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("reset %s: %w", uuid, ctx.Err())
	}
}

// serveReset applies a reset request at the current time and returns the events to come.
func (b *Backend) serveReset(req resetRequest, start time.Time, events []Event, sink gpu.Sink) []Event {
	now := b.opts.Clock.Now()
	if b.opts.Virtual {
		now = start
		if len(events) > 0 {
			now = start.Add(events[0].At)
		}
	}
	i := slices.IndexFunc(b.gpus, func(g *gpuState) bool { return g.uuid == req.uuid })
	switch {
	case i < 0:
		req.done <- fmt.Errorf("reset %s: no such GPU on simulated node %s", req.uuid, b.sc.Node)
		return events
	case b.gpus[i].lost:
		req.done <- fmt.Errorf("reset %s: %w", req.uuid, errLost)
		return events
	}
	b.gpus[i].apply(Event{Kind: EventReset, GPU: i, Repeat: 1}, now, sink)
	req.done <- nil
	return b.afterReset(events, i, now.Sub(start))
}

var errLost = errors.New("the GPU is lost and does not respond to a reset; reboot the node")

// afterReset adds the scenario's afterReset events of GPU i to events, after a reset at offset at.
func (b *Backend) afterReset(events []Event, i int, at time.Duration) []Event {
	for _, ev := range b.sc.AfterReset {
		if ev.GPU != i {
			continue
		}
		ev.At += at
		pos, _ := slices.BinarySearchFunc(events, ev.At, func(e Event, t time.Duration) int {
			if e.At <= t {
				return -1
			}
			return 1
		})
		events = slices.Insert(events, pos, ev)
	}
	return events
}
