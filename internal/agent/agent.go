// Package agent wires a GPU backend to the health library and the library to the reporters:
// the job of `gpuhealth agent`, one per GPU node.
//
//	backend ──signals──▶ Monitor ──updates──▶ fan-out ──▶ damped Writers schedulers read (annotation, devicetaint, hami)
//	                                                  ├──▶ metrics, the log; evictor, remediation
//	                                                  └──▶ followers: once those wrote, Node Events and the other
//	                                                       Writers (condition, claimstatus)
//
// wiring.go builds the parts once (wire); Run starts the loops, all under one errgroup:
//
//   - the health runtime: the backend and the kernel log beside it (kmsg.Companion) feeding the
//     Monitor, the quiet-period ticks and the checkpoint;
//   - one goroutine per Writer (report.Writer), the fan-out (fanout.go) and the followers
//     (followers.go);
//   - remediation and eviction, when configured (remediation.go, eviction.go);
//   - the watchers of operators' requests on the Node: drains (drains.go) and clears (clears.go);
//   - the NVLink-domain peers' lookup (peers.go), unless agent.nvlinkDomainLabel is "-";
//   - NVIDIA's Device API on a Unix socket, when agent.deviceAPI.socket is set (pkg/deviceapi);
//   - the HTTP server (/metrics, /healthz, /readyz), when MetricsAddress is set.
//
// The first loop that fails cancels the others; a cancelled context (SIGTERM) stops everything
// cleanly.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/heartbeat"
	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/deviceapi"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Staller is a Backend that can tell a hung call into its driver (gpunvml.Backend.Stalled):
// /healthz fails while Stalled reports one, so that the kubelet restarts the agent.
type Staller interface {
	Stalled(now time.Time) error
}

// Options configure an agent. NodeName, Client, Backend and Policy are required.
type Options struct {
	NodeName string
	Client   kube.Interface
	Backend  gpu.Backend
	Policy   *health.Policy
	// BootID identifies the current boot, for the checkpoint.
	BootID string
	// BootTime is when the node booted. Sticky faults this agent reported on its Node after
	// that time are restored from there when the checkpoint is missing or unusable, and merged
	// when the report is newer than the checkpoint; zero turns that fallback off.
	BootTime time.Time
	Agent    config.AgentConfig
	// MetricsAddress serves /metrics, /healthz and /readyz; empty turns the server off.
	MetricsAddress string
	// Ready, when set, is called with the server's address once it listens (tests use ":0").
	Ready func(addr string)
	Clock clock.WithTicker
	// Registry receives the metrics (default: a new registry).
	Registry *prometheus.Registry
	// KernelLog is read beside the backend (kmsg.OpenCompanion); nil means none.
	KernelLog *kmsg.Companion
	// Remediation, when its Config is enabled, resets GPUs that need it.
	Remediation RemediationOptions
	// Missing are placeholders for GPUs the node should have and the backend cannot open
	// (health.MissingGPUs): tracked and reported beside the backend's devices.
	Missing []health.Device
	// StartEvents are recorded on the Node once the agent has started: what its start-up found
	// that an operator should hear of (GPUs left out of the inventory for another driver).
	StartEvents []Event
	// Nodes, when set, is the cache of this agent's Node to share (the command watches the
	// GPU operator's labels through it); the caller starts and shuts it down. Nil: Run makes
	// its own.
	Nodes *nodecache.Cache
	// Records, when set, are the GPURecords the agent reads when it starts: a GPU whose record
	// meets RepeatOffender is marked a repeat offender (offenders.go).
	Records        kube.GPURecordInterface
	RepeatOffender gpurecord.RepeatOffenderRule
}

// Event is an Event the agent records on its Node.
type Event struct {
	// Type is corev1.EventTypeNormal or corev1.EventTypeWarning.
	Type, Reason, Message string
}

// Run runs the agent until ctx is done or a loop fails.
func Run(ctx context.Context, opts Options) error {
	if opts.NodeName == "" || opts.Client == nil || opts.Backend == nil || opts.Policy == nil {
		return errors.New("agent: node name, client, backend and policy are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if opts.KernelLog == nil {
		opts.KernelLog = kmsg.NewCompanion()
	}
	logger := klog.FromContext(ctx).WithValues("node", opts.NodeName)
	ctx = klog.NewContext(ctx, logger)
	w, err := wire(ctx, opts)
	if err != nil {
		return err
	}
	defer w.close()

	g, ctx := errgroup.WithContext(ctx)
	sub := w.monitor.Subscribe()
	defer sub.Close()
	g.Go(func() error {
		// The runtime ticks the monitor, saves the checkpoint on every sticky change and runs
		// the backend and the kernel log; a backend that fails stops the agent.
		err := w.rt.Run(ctx, func(ctx context.Context, mon *health.Monitor) error {
			return opts.KernelLog.Run(ctx, mon, func(ctx context.Context) error {
				return opts.Backend.Run(ctx, opts.KernelLog.BackendFeed(mon, w.metrics.SignalObserver(opts.Clock)))
			})
		})
		if err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		return nil
	})
	for _, wr := range w.writers {
		g.Go(func() error { return wr.Run(ctx) })
	}
	// The sinks schedulers read go first; the rest (the condition, claim status, Events) follow
	// once those have written and the agent's own Node watch has seen the write, so that their
	// requests compete neither with the scheduler path's requests nor with the delivery of its
	// watch events.
	g.Go(func() error { return w.fan.followers.run(ctx, w.fan.scheduling) })
	g.Go(func() error { return w.fan.run(ctx, sub) })
	if w.rem != nil {
		g.Go(func() error {
			// Claims are matched to GPUs through the DRA devices: the cache must be filled first.
			if err := w.caches.devices.Start(ctx); err != nil {
				return fmt.Errorf("remediation: %w", err)
			}
			return w.rem.Run(ctx)
		})
	}
	if w.evictor != nil {
		g.Go(func() error {
			if err := w.startEvictor(ctx); err != nil {
				return fmt.Errorf("eviction: %w", err)
			}
			return w.evictor.Run(ctx)
		})
	}
	// The heartbeat: a Lease of this node's in the agent's namespace (the circuit breaker's:
	// $POD_NAMESPACE, the chart's), renewed every agent.heartbeat.
	period := time.Duration(*w.cfg.Heartbeat)
	beat := &heartbeat.Renewer{Client: opts.Client, Namespace: w.cfg.CircuitBreaker.Namespace, Node: opts.NodeName,
		Period: period, StaleAfter: gpuhealthv1.StaleAfterPeriods * period, Clock: opts.Clock}
	g.Go(func() error { return beat.Run(ctx) })
	w.goClusterWatchers(ctx, g)
	if api := w.cfg.DeviceAPI; api.Socket != "" {
		// NVIDIA's Device API for node-local readers (docs/device-api.md): straight from the
		// Monitor, like every subscriber, so no reader can slow the reporters.
		srv := deviceapi.New(w.monitor, deviceapi.Options{MaxWatchers: api.MaxWatchers, Clock: opts.Clock})
		g.Go(func() error { return srv.ServeSocket(ctx, deviceapi.SocketOptions{Path: api.Socket, Group: api.Group}) })
	}
	if opts.MetricsAddress != "" {
		g.Go(func() error { return serve(ctx, opts, w.writers, w.rt.CheckpointSaved) })
	}
	for _, e := range opts.StartEvents {
		w.recorder.Event(w.nodeRef, e.Type, e.Reason, e.Message)
	}
	logger.Info("Agent started", "gpus", len(opts.Backend.Devices()), "missingGPUs", len(opts.Missing), "reporters", w.cfg.Reporters, "bootID", opts.BootID)
	return g.Wait()
}

// goClusterWatchers runs in g the loops that follow what the cluster says of this node's GPUs:
// the operators' drains, clear and validation requests, the NVLink-domain peers' faults, and the
// GPUs' records (fleet.repeatOffender), each only when configured.
func (w *wiring) goClusterWatchers(ctx context.Context, g *errgroup.Group) {
	opts := w.opts
	drains := &drainWatcher{nodes: w.caches.nodes, monitor: w.monitor, clock: opts.Clock, recorder: w.recorder, nodeRef: w.nodeRef}
	g.Go(func() error { return drains.run(ctx) })
	clears := &requestWatcher{nodes: w.caches.nodes, client: opts.Client, clock: opts.Clock, recorder: w.recorder, nodeRef: w.nodeRef, memory: w.monitor,
		kind: clearRequests(w.monitor, opts.Clock, w.recorder, w.nodeRef)}
	g.Go(func() error { return clears.run(ctx) })
	validations := &requestWatcher{nodes: w.caches.nodes, client: opts.Client, clock: opts.Clock, recorder: w.recorder, nodeRef: w.nodeRef, memory: w.monitor,
		kind: validationRequests(w.rem, w.monitor, w.recorder, w.nodeRef)}
	g.Go(func() error { return validations.run(ctx) })
	if label := w.cfg.NVLinkDomainLabel; label != "-" {
		peers := &peerResolver{client: opts.Client, nodes: w.caches.nodes, label: label, monitor: w.monitor, clock: opts.Clock}
		g.Go(func() error { return peers.run(ctx) })
	}
	if opts.Records != nil && opts.RepeatOffender.Enabled() {
		offenders := &offenderCheck{records: opts.Records, rule: opts.RepeatOffender, devices: opts.Backend.Devices(), monitor: w.monitor,
			clock: opts.Clock, recorder: w.recorder, nodeRef: w.nodeRef}
		g.Go(func() error { return offenders.run(ctx) })
	}
}

// serve runs the HTTP server until ctx is done. /readyz turns ready once every reporter has
// synced successfully at least once after start, that is, once the start-up reconcile is done,
// and is not ready while the checkpoint holds less than the agent knows (a failed write: a
// restart then would lose faults).
func serve(ctx context.Context, opts Options, writers []*report.Writer, checkpointSaved func() bool) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if st, ok := opts.Backend.(Staller); ok {
			if err := st.Stalled(opts.Clock.Now()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok"))
	})
	var ready atomic.Bool // once ready, always ready: later sync errors are retried, not fatal
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			all := true
			for _, wr := range writers {
				all = all && wr.Synced()
			}
			ready.Store(all)
		}
		if !ready.Load() {
			http.Error(w, "reporters have not synced yet", http.StatusServiceUnavailable)
			return
		}
		if !checkpointSaved() {
			http.Error(w, "the last checkpoint write failed (retried every tick)", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", opts.MetricsAddress)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", opts.MetricsAddress, err)
	}
	if opts.Ready != nil {
		opts.Ready(lis.Addr().String())
	}
	return httpserve.Serve(ctx, lis, mux)
}
