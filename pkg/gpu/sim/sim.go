// Package sim is a simulated GPU backend driven by a scenario file: a list of timed faults and
// repairs (see docs/scenario.md). It powers `gpuhealth simulate`, the demo, the e2e tests and the
// benchmarks.
//
// The simulator keeps each GPU's readings (ECC and PCIe counters, temperature, clock-event
// reasons, NVLink state, remapper state, recovery action) the way NVML would report them. Events
// change those readings and emit the matching signal at once; every SampleInterval it also emits
// a full sampling round, as the NVML backend's sampler does, so polled checks see clean samples
// and their hysteresis can close. PCIe replay and NVLink error counters are the exception: NVML
// offers them only to polling, so their increases show in the next round and their rates are
// measured over whole rounds, as on real hardware. A lost GPU answers every sample with "lost". Events at the
// same instant as a sampling round come first; the round at 0s comes before everything and sets
// the counters' baselines.
//
// A replay runs either on virtual time (Options.Virtual: an hour of scenario takes milliseconds)
// or on a clock (k8s.io/utils/clock), for the agent and the demo.
//
// The simulated GPUs also answer an active diagnostic as NVIDIA's DCGM does (Backend.Diagnose,
// and the simulated driver's dcgmi, both through DCGMDiag, which writes DCGM 3.x's and 4.x's
// documents and exit codes): a scenario's diag events say how, and its latent faults are seen
// by a diagnostic under load and by nothing else.
package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Simulated thresholds and idle readings.
const (
	SlowdownC          = 90
	ShutdownC          = 95
	IdleTemperatureC   = 35
	DefaultSampleEvery = 10 * time.Second
)

// Backend feeds the one sink every backend feeds (gpu.Sink: signals, and Reboot when the node
// reboots; it never calls SetUnmonitored), and a PeerSink the peer nodes' faults.
var _ gpu.Backend = (*Backend)(nil)

// Options control a replay.
type Options struct {
	// SampleInterval is the period of sampling rounds (default DefaultSampleEvery).
	SampleInterval time.Duration
	// Settle is how long the replay goes on after the last event when the scenario has no
	// duration (default: three sampling rounds).
	Settle time.Duration
	// Virtual replays on virtual time starting at Start: no waiting at all.
	Virtual bool
	// Start is the time of the scenario's 0s on virtual time (default: the Unix epoch).
	Start time.Time
	// Clock paces a non-virtual replay (default: the real clock).
	Clock clock.Clock
	// Forever keeps sampling after the scenario's end until the context is cancelled, as an
	// agent does.
	Forever bool
}

// Backend simulates the GPUs of one node.
type Backend struct {
	sc      *Scenario
	opts    Options
	devices []health.Device
	gpus    []*gpuState
	boots   int
	// mapper turns the scenario's kmsg lines into signals; kmsgSignals is its reused buffer,
	// spoofed counts lines of another facility than the kernel's.
	mapper      *kmsg.Mapper
	kmsgSignals []health.Signal
	spoofed     int
	// resets carries Reset's requests to the Run loop, which owns the GPUs' state.
	resets chan resetRequest
	// peers are the peer nodes' faults the scenario's peerFault events reported so far.
	peers map[peerKey]health.PeerFault

	// The GPUs' diagnostic state (diag.go), which Diagnose reads from any goroutine while Run
	// applies the scenario: diag and diagLost by GPU index, and whether a diagnostic runs.
	diagMu      sync.Mutex
	diag        []DiagState
	diagLost    []bool
	diagRunning bool
}

var (
	_ gpu.Resetter  = (*Backend)(nil)
	_ gpu.Diagnoser = (*Backend)(nil)
)

// New returns a backend for sc.
func New(sc *Scenario, opts Options) *Backend {
	if opts.SampleInterval <= 0 {
		opts.SampleInterval = DefaultSampleEvery
	}
	if opts.Settle <= 0 {
		opts.Settle = 3 * opts.SampleInterval
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Start.IsZero() {
		opts.Start = time.Unix(0, 0).UTC()
	}
	b := &Backend{sc: sc, opts: opts, devices: sc.Devices(), resets: make(chan resetRequest),
		diag: make([]DiagState, sc.GPUCount), diagLost: make([]bool, sc.GPUCount)}
	// Kernel-log lines about a missing GPU name its address: they reach its placeholder.
	b.mapper = kmsg.NewMapper(slices.Concat(b.devices, sc.Placeholders()))
	for i := range sc.GPUCount {
		g := &gpuState{uuid: GPUUUID(sc.Node, i), temperature: IdleTemperatureC, missing: sc.Missing[i]}
		for m := 1; m <= sc.MIGInstances[i]; m++ {
			g.migUUIDs = append(g.migUUIDs, MIGUUID(sc.Node, i, m))
		}
		b.gpus = append(b.gpus, g)
	}
	// Links are sampled from the first round, so an error counter has a baseline before the
	// first increase, as it would on a GPU whose links exist from the start; so are the early
	// warnings a GPU's events concern.
	for _, ev := range sc.Events {
		if ev.Kind == EventNVLink {
			b.gpus[ev.GPU].linksSeen |= 1 << ev.Link
		}
	}
	b.seeEarlyWarnings()
	return b
}

// Placeholders returns the placeholders of the scenario's missing GPUs (gpus.missing), which
// the tracker must know beside Devices.
func (b *Backend) Placeholders() []health.Device { return b.sc.Placeholders() }

// Devices returns the simulated GPUs and MIG instances the driver answers for.
func (b *Backend) Devices() []health.Device { return b.devices }

// NodeName returns the scenario's node name.
func (b *Backend) NodeName() string { return b.sc.Node }

// BootID returns the simulated node's current boot ID.
func (b *Backend) BootID() string { return fmt.Sprintf("%s-boot-%d", b.sc.Node, b.boots) }

// End is where a replay stops (without Options.Forever), as an offset from the start.
func (b *Backend) End() time.Duration { return b.sc.End(b.opts.Settle) }

// Run replays the scenario into sink. It returns nil at the scenario's end (or, with Forever,
// when ctx is cancelled), and ctx's error if cancelled before the end.
func (b *Backend) Run(ctx context.Context, sink gpu.Sink) error {
	if _, ok := sink.(PeerSink); !ok && b.sc.HasPeerFaults() {
		return errors.New("scenario: peerFault events are replayed by gpuhealth simulate only; an agent reads its peers' faults from their nodes' reports")
	}
	b.peers = map[peerKey]health.PeerFault{}
	start := b.opts.Start
	if !b.opts.Virtual {
		start = b.opts.Clock.Now()
	}
	end := b.End()
	interval := b.opts.SampleInterval
	// The first sampling round sets every counter's baseline before anything happens. After it,
	// events come before the sampling round of the same instant, so a counter increase is
	// measured against the previous round.
	for _, g := range b.gpus {
		g.sample(start, sink)
	}
	nextSample := interval
	// A copy: resets add the scenario's afterReset events to it.
	events := slices.Clone(b.sc.Events)
	for {
		sample := len(events) == 0 || nextSample < events[0].At
		at := nextSample
		if !sample {
			at = events[0].At
		}
		if at > end && !b.opts.Forever {
			return nil
		}
		now := start.Add(at)
		if !b.opts.Virtual {
			req, err := b.waitUntil(ctx, now)
			if err != nil {
				if b.opts.Forever {
					return nil
				}
				return err
			}
			if req != nil {
				events = b.serveReset(*req, start, events, sink)
				continue
			}
		} else if err := ctx.Err(); err != nil {
			return err
		} else {
			select {
			case req := <-b.resets:
				events = b.serveReset(req, start, events, sink)
				continue
			default:
			}
		}
		if sample {
			for _, g := range b.gpus {
				g.sample(now, sink)
			}
			nextSample += interval
			continue
		}
		ev := events[0]
		events = events[1:]
		b.apply(ev, now, sink)
		if ev.Kind == EventReset {
			events = b.afterReset(events, ev.GPU, at)
		}
	}
}

// waitUntil waits for t, or for a reset request, which it returns.
func (b *Backend) waitUntil(ctx context.Context, t time.Time) (*resetRequest, error) {
	d := t.Sub(b.opts.Clock.Now())
	if d <= 0 {
		return nil, ctx.Err()
	}
	timer := b.opts.Clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case req := <-b.resets:
		return &req, nil
	case <-timer.C():
		return nil, nil
	}
}

func (b *Backend) apply(ev Event, now time.Time, sink gpu.Sink) {
	switch ev.Kind {
	case EventDiag, EventLatent:
		// Only a diagnostic sees them: no signal, no reading changes.
		b.setDiag(ev)
		return
	case EventLost, EventReboot:
		b.setDiag(ev)
	}
	if ev.Kind == EventReboot {
		b.boots++
		for _, g := range b.gpus {
			g.reboot()
		}
		sink.Reboot(b.BootID(), now)
		return
	}
	if ev.Kind == EventKmsg {
		for range ev.Repeat {
			b.applyKmsg(ev, now, sink)
		}
		return
	}
	if ev.Kind == EventPeerFault {
		b.applyPeerFault(ev, now, sink.(PeerSink)) // Run refused a sink without peers
		return
	}
	g := b.gpus[ev.GPU]
	for range ev.Repeat {
		g.apply(ev, now, sink)
	}
}
