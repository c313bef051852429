// Package agenttest holds helpers for tests and benchmarks that run the agent in-process.
package agenttest

import (
	"context"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Backend is an agent backend a test drives signal by signal: every value sent on Signals is
// handed to the agent, until the agent stops. Make Signals buffered to send a wave without
// waiting for each agent.
type Backend struct {
	GPUs    []health.Device
	Signals chan health.Signal
}

var _ gpu.Backend = (*Backend)(nil)

// Devices implements gpu.Backend.
func (b *Backend) Devices() []health.Device { return b.GPUs }

// Run implements gpu.Backend.
func (b *Backend) Run(ctx context.Context, sink gpu.Sink) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-b.Signals:
			sink.Signal(s)
		}
	}
}
