// Package gpu holds what every GPU backend is (Backend, the Sink it feeds) and offers besides
// its signals (Resetter, Diagnoser). Each backend lives in a package below this one (nvml, sim), and so
// does the kernel log read beside them (kmsg).
package gpu

import (
	"context"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Resetter resets one GPU. Reset returns once the reset is done, or with what went wrong; after
// a successful reset the backend's signal stream reports it (health.SignalReset for the GPU), as
// it does a reset someone else made, so the health library clears what a reset clears. A GPU
// must not be reset while work runs on it: the caller checks.
type Resetter interface {
	Reset(ctx context.Context, uuid string) error
}

// Diagnoser runs an active diagnostic of one GPU as NVIDIA's `dcgmi diag -j` does, and returns
// what dcgmi would: its output (the JSON document, DCGM's GPU id being the GPU's index) and exit
// code. The simulated GPUs implement it (pkg/gpu/sim); on real GPUs the agent runs DCGM itself.
// A diagnostic still running when ctx is done is abandoned with ctx's error.
type Diagnoser interface {
	Diagnose(ctx context.Context, uuid string) (output []byte, exitCode int, err error)
}

// Sink is what every Backend feeds: a *health.Monitor, or the health.Feed in front of one that
// kmsg.Companion.BackendFeed returns. It is the one sink of the backends; a backend that needs
// more asks for it through a small interface of its own, discovered by type assertion (the NVML
// backend's CheckSink, the simulator's PeerSink).
type Sink interface {
	// Signal receives one signal.
	Signal(health.Signal)
	// Reboot is called when the node reboots, with the new boot ID (the simulator's reboots).
	Reboot(bootID string, at time.Time)
	// SetUnmonitored marks a device whose events cannot be watched (or clears the mark).
	SetUnmonitored(uuid string, unmonitored bool)
}

var (
	_ Sink = (*health.Monitor)(nil)
	_ Sink = (*health.Feed)(nil)
)

// Backend is a source of GPU signals: the GPUs it watches, and a Run that feeds their signals
// to a sink until its context ends or the backend fails.
type Backend interface {
	Devices() []health.Device
	Run(ctx context.Context, sink Sink) error
}
