package agentcmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// The NVIDIA driver often comes up after the agent: the GPU operator's driver container
// installs it once the node is up, and a driver upgrade takes it away for minutes. So when NVML
// is not available (gpunvml.ErrNoDriver: no library, a library the loader refuses, no kernel
// driver) the agent does not exit: it says why in one log line, reports itself not ready and
// gpuhealth_source_up{source="nvml"} 0 on its metrics address, sets the GPUUnhealthy Node
// condition to Unknown (the GPUs' health is not known; nothing else it reported is touched), and
// tries again with backoff until NVML opens.

// Backoff between attempts to open NVML while it is not available.
const (
	driverWaitInitial = time.Second
	driverWaitMax     = 30 * time.Second
)

// driverWait is what waitForDriver needs.
type driverWait struct {
	node           string
	client         kube.Interface // nil: no Node condition (tests)
	metricsAddress string
	clock          clock.WithTicker
	initial, max   time.Duration
	// ready, when set, is told the address the waiting server listens on (tests use ":0").
	ready func(addr string)
	// pause, when set, holds NVML back while the GPU operator pauses GPU clients: open is not
	// called then. away, when set, is since when and why an earlier image of this process
	// released NVML (driverlife.go).
	pause *nodegpu.OperatorPause
	away  *driverAway
}

// waitForDriver calls open until it succeeds, returns an error that is not gpunvml.ErrNoDriver
// (returned as it is), or ctx ends (ctx's error). While NVML is not available, or the GPU
// operator pauses GPU clients (then open is not called at all), it serves /healthz, /readyz
// (not ready) and /metrics on the metrics address.
func waitForDriver[T any](ctx context.Context, w driverWait, open func() (T, error)) (T, error) {
	var zero T
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	a := &attempts[T]{w: &w, open: open}
	if w.away != nil {
		a.pausedSince = w.away.Since
	}
	got, err, done := a.attempt(ctx)
	if done {
		return got, err
	}
	logger := klog.FromContext(ctx)
	if w.initial <= 0 {
		w.initial, w.max = driverWaitInitial, driverWaitMax
	}

	state := &waitState{}
	state.set(err)
	stopServing, serr := w.serveWaiting(ctx, state)
	if serr != nil {
		return zero, serr
	}
	defer stopServing()

	delay := w.initial
	var said waitReport
	for {
		paused := errors.As(err, new(*awayError)) && !errors.Is(err, gpunvml.ErrNoDriver)
		said.say(ctx, &w, err, paused, delay)
		retried, cerr := w.sleep(ctx, paused, delay)
		if cerr != nil {
			return zero, cerr
		}
		if retried {
			delay = min(2*delay, w.max)
		}
		got, err, done = a.attempt(ctx)
		if done {
			if err == nil {
				logger.Info("NVML is available: starting")
			}
			return got, err
		}
		state.set(err)
	}
}

// attempts opens NVML unless the operator pauses GPU clients.
type attempts[T any] struct {
	w    *driverWait
	open func() (T, error)
	// pausedSince dates the pause from when NVML was released (by an earlier image of the
	// process), or else from when this one first saw it, so that the message stays the same
	// while it lasts.
	pausedSince time.Time
}

// attempt reports whether the wait is over, with what open returned.
func (a *attempts[T]) attempt(ctx context.Context) (T, error, bool) {
	var zero T
	w := a.w
	reason, err := w.pause.Lookup(ctx)
	if err != nil && w.away != nil && strings.HasPrefix(w.away.Reason, nodegpu.PausedReasonPrefix) {
		// Released for the operator's pause, and the Node cannot be read yet (the cache
		// is filling, the API server flaps): the pause is taken to last until it can.
		reason = w.away.Reason + "; the Node cannot be read yet"
	}
	if reason != "" {
		if a.pausedSince.IsZero() {
			a.pausedSince = w.clock.Now()
		}
		return zero, &awayError{away: driverAway{Since: a.pausedSince, Reason: reason}}, false
	}
	got, err := a.open()
	if err == nil || !errors.Is(err, gpunvml.ErrNoDriver) {
		return got, err, true
	}
	if w.away != nil {
		err = fmt.Errorf("%w: %w", &awayError{away: *w.away}, err)
	}
	return zero, err, false
}

// serveWaiting serves state on the metrics address (when there is one) until the function it
// returns is called, which waits for the server to stop.
func (w *driverWait) serveWaiting(ctx context.Context, state *waitState) (func(), error) {
	serveCtx, stopServing := context.WithCancel(ctx)
	served := make(chan error, 1)
	if w.metricsAddress != "" {
		lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", w.metricsAddress)
		if err != nil {
			stopServing()
			return nil, fmt.Errorf("listen on %s: %w", w.metricsAddress, err)
		}
		if w.ready != nil {
			w.ready(lis.Addr().String())
		}
		go func() { served <- httpserve.Serve(serveCtx, lis, state.handler(w.node)) }()
	} else {
		served <- nil
	}
	return func() {
		stopServing()
		if err := <-served; err != nil {
			klog.FromContext(ctx).Error(err, "Serving while NVML was not available")
		}
	}, nil
}

// waitReport is what the wait last said: the reason last logged, and last written to the Node.
type waitReport struct{ logged, marked string }

// say logs why NVML is not used, and marks the GPUUnhealthy condition Unknown with it, each
// once per reason.
func (r *waitReport) say(ctx context.Context, w *driverWait, err error, paused bool, delay time.Duration) {
	logger := klog.FromContext(ctx)
	msg := err.Error()
	if msg != r.logged {
		if paused {
			logger.Info("NVML is released while the GPU operator pauses GPU clients: the agent is not ready and reports the GPUs' health as unknown until they are resumed", "reason", msg)
		} else {
			logger.Error(err, "NVML is not available: the agent is not ready and reports the GPUs' health as unknown until it is; retrying with backoff", "backoff", delay)
		}
		r.logged = msg
	}
	if w.client != nil && msg != r.marked {
		if cerr := nodecondition.ReportUnknown(ctx, w.client, w.node, "gpuhealth cannot read this node's GPUs: "+msg, w.clock.Now()); cerr != nil {
			logger.V(2).Info("Could not mark the GPUUnhealthy condition Unknown yet", "err", cerr)
		} else {
			r.marked = msg
		}
	}
}

// sleep waits for the next attempt: while paused only a change of the Node ends the wait;
// otherwise the backoff of delay does too (retried). It returns ctx's error when ctx ends.
func (w *driverWait) sleep(ctx context.Context, paused bool, delay time.Duration) (retried bool, err error) {
	var retry <-chan time.Time
	var timer clock.Timer
	if !paused {
		timer = w.clock.NewTimer(delay)
		retry = timer.C()
	}
	select {
	case <-ctx.Done():
		if timer != nil {
			timer.Stop()
		}
		return false, ctx.Err()
	case <-retry:
		return true, nil
	case <-w.pause.Changes():
		if timer != nil {
			timer.Stop()
		}
		return false, nil
	}
}

// waitState is what the waiting server shows.
type waitState struct {
	reason atomic.Pointer[string]
}

func (s *waitState) set(err error) {
	msg := err.Error()
	s.reason.Store(&msg)
}

func (s *waitState) handler(node string) http.Handler {
	reg := prometheus.NewRegistry()
	up := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metrics.SourceUpName, Help: metrics.SourceUpHelp}, []string{"node", "source"})
	up.WithLabelValues(node, "nvml").Set(0)
	reg.MustRegister(up)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "NVML is not available: "+*s.reason.Load(), http.StatusServiceUnavailable)
	})
	return mux
}
