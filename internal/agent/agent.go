// Package agent wires a GPU backend to the health library and the library to the reporters:
// the job of `gpuhealth agent`, one per GPU node.
//
//	backend ──signals──▶ Monitor ──updates──▶ fan-out ──▶ damped Writers schedulers read (annotation, devicetaint, hami)
//	                                                  ├──▶ metrics, checkpoint file
//	                                                  └──▶ followers: once those wrote, Node Events and the other
//	                                                       Writers (condition, claimstatus)
//
// Every loop runs under one errgroup: the backend, one goroutine per writer, the fan-out, the
// followers, the drains and clears watchers, the NVLink-domain peers' lookup (peers.go), the
// quiet-period ticker and the HTTP server (/metrics, /healthz, /readyz). The first loop that
// fails cancels the others; a cancelled context (SIGTERM) stops everything cleanly.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	"github.com/gpuhealth/gpuhealth/internal/report/claimstatus"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/hami"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Sink is what a backend feeds: the Monitor, plus the agent's latency measurement.
type Sink interface {
	Signal(health.Signal)
	Reboot(bootID string, at time.Time)
	SetUnmonitored(uuid string, unmonitored bool)
}

// Backend is a source of GPU signals.
type Backend interface {
	Devices() []health.Device
	Run(ctx context.Context, sink Sink) error
}

// Staller is a Backend that can tell a hung call into its driver (gpunvml.Backend.Stalled):
// /healthz fails while Stalled reports one, so that the kubelet restarts the agent.
type Staller interface {
	Stalled(now time.Time) error
}

// Options configure an agent. NodeName, Client, Backend and Policy are required.
type Options struct {
	NodeName string
	Client   kube.Interface
	Backend  Backend
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
	// KernelLog is read beside the backend (OpenKernelLog); nil means none.
	KernelLog *KernelLog
	// Remediation, when its Config is enabled, resets GPUs that need it.
	Remediation RemediationOptions
	// Missing are placeholders for GPUs the node should have and the backend cannot open
	// (health.MissingGPUs): tracked and reported beside the backend's devices.
	Missing []health.Device
	// Nodes, when set, is the cache of this agent's Node to share (the command watches the
	// GPU operator's labels through it); the caller starts and shuts it down. Nil: Run makes
	// its own.
	Nodes *nodecache.Cache
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
		opts.KernelLog = &KernelLog{dedup: kmsg.NewDedup(0)}
	}
	agentCfg := opts.Agent.WithDefaults()
	logger := klog.FromContext(ctx).WithValues("node", opts.NodeName)
	ctx = klog.NewContext(ctx, logger)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(kube.EventSink{Client: opts.Client})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "gpuhealth-agent", Host: opts.NodeName})
	nodeRef := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: opts.NodeName}

	checkpointPath := agentCfg.CheckpointPath
	if checkpointPath == "-" {
		checkpointPath = ""
	}
	rt, err := health.NewRuntime(opts.Policy, slices.Concat(opts.Backend.Devices(), opts.Missing), health.RuntimeOptions{
		Clock: opts.Clock, CheckpointPath: checkpointPath, BootID: opts.BootID,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	monitor := rt.Monitor()
	tracker := monitor.Tracker() // metrics read its snapshot
	opts.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "gpuhealth_checkpoint_write_failures_total",
		Help:        "Checkpoint writes that failed (each is tried again every tick; the agent is not ready while the last one failed).",
		ConstLabels: prometheus.Labels{"node": opts.NodeName},
	}, func() float64 { return float64(rt.CheckpointFailures()) }))
	restored, err := rt.Restore()
	if err != nil {
		logger.Error(err, "Ignoring the checkpoint", "path", checkpointPath)
		recorder.Eventf(nodeRef, corev1.EventTypeWarning, "CheckpointIgnored", "gpuhealth ignored its checkpoint %s: %v", checkpointPath, err)
	} else if restored {
		logger.Info("Restored the checkpoint", "path", checkpointPath)
	}
	restoreFromNodeReport(ctx, opts, monitor, checkpointPath, restored)

	// Metrics show GPUs under repair as the reporters do (rem is set below, before the server
	// that scrapes them starts).
	var rem *remediation.Controller
	m := metrics.New(opts.NodeName, func() health.Snapshot {
		if rem != nil {
			return rem.Decorate(tracker.Snapshot())
		}
		return tracker.Snapshot()
	})
	if err := m.Register(opts.Registry); err != nil {
		return fmt.Errorf("agent: register metrics: %w", err)
	}
	backendSource, _ := opts.Backend.(metrics.Backend)
	if err := opts.Registry.Register(metrics.NewSources(opts.NodeName, opts.KernelLog, backendSource)); err != nil {
		return fmt.Errorf("agent: register metrics: %w", err)
	}
	events := nodecondition.NewEvents(recorder, opts.NodeName, "")
	// One cache of the Node and one of its DRA devices, shared by every reporter and the drains
	// watcher: one watch of each per agent.
	attrs := draAttributes(agentCfg)
	if err := attrs.Validate(); err != nil {
		return fmt.Errorf("agent: DRA attribute names: %w", err)
	}
	caches := sharedCaches{
		nodes:      opts.Nodes,
		devices:    dradevices.NewWithAttributes(opts.Client, opts.NodeName, agentCfg.DriverName, attrs),
		sharedNode: opts.Nodes != nil,
	}
	if caches.nodes == nil {
		caches.nodes = nodecache.New(opts.Client, opts.NodeName)
	}
	defer caches.shutdown()
	writers, err := newWriters(opts, agentCfg, caches, m, recorder, nodeRef)
	if err != nil {
		return err
	}
	remChanged := make(chan struct{}, 1) // the repair states changed: report again
	var remWriter *report.Writer
	rem, remWriter, err = newRemediation(ctx, opts, agentCfg, caches, opts.Registry, recorder, nodeRef,
		report.WriterOptions{Resync: time.Duration(*agentCfg.Resync), Clock: opts.Clock, Observer: m},
		func() {
			select {
			case remChanged <- struct{}{}:
			default:
			}
		})
	if err != nil {
		return err
	}
	if remWriter != nil {
		writers = append(writers, remWriter)
	}
	evictor, startEvictor, err := newEvictor(opts, agentCfg, recorder, nodeRef)
	if err != nil {
		return err
	}
	sink := &meteredSink{metrics: m, clock: opts.Clock, kernelLog: opts.KernelLog}
	if rem != nil {
		sink.onReset = rem.ResetObserved
	}

	g, ctx := errgroup.WithContext(ctx)
	sub := monitor.Subscribe()
	defer sub.Close()
	g.Go(func() error {
		// The runtime ticks the monitor, saves the checkpoint on every sticky change and runs
		// the backend and the kernel log; a backend that fails stops the agent.
		err := rt.Run(ctx, func(ctx context.Context, mon *health.Monitor) error {
			sink.monitor = mon
			return opts.KernelLog.Run(ctx, mon, func(ctx context.Context) error { return opts.Backend.Run(ctx, sink) })
		})
		if err != nil {
			return fmt.Errorf("backend: %w", err)
		}
		return nil
	})
	for _, w := range writers {
		g.Go(func() error { return w.Run(ctx) })
	}
	// The sinks schedulers read go first; the rest (the condition, claim status, Events) follow
	// once those have written and the agent's own Node watch has seen the write, so that their
	// requests compete neither with the scheduler path's requests nor with the delivery of its
	// watch events.
	scheduling, following := splitBySchedulerPath(writers)
	after := newFollowers(following, events)
	after.delivered = caches.nodes.WaitCaughtUp
	g.Go(func() error { return after.run(ctx, scheduling) })
	// The fan-out alone reports to the writers, so that they always get the latest snapshot with
	// the latest repair states.
	var (
		latest     health.Snapshot
		haveLatest bool
	)
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-remChanged:
				if rem != nil && haveLatest {
					snap := rem.Decorate(latest)
					for _, w := range scheduling {
						_ = w.Report(ctx, snap)
					}
					after.add(health.Update{Snapshot: snap}, scheduling)
				}
				continue
			case <-sub.C():
			}
			u, ok := sub.Next()
			if !ok {
				continue
			}
			latest, haveLatest = u.Snapshot, true
			if evictor != nil {
				evictor.Update(u.Snapshot)
			}
			if rem != nil {
				rem.Update(u.Snapshot)
				u.Snapshot = rem.Decorate(u.Snapshot)
			}
			for _, w := range scheduling {
				_ = w.Report(ctx, u.Snapshot)
			}
			after.add(u, scheduling)
			if u.Dropped > 0 {
				logger.Info("Fell behind; some transitions were not recorded as events", "dropped", u.Dropped)
			}
			m.Transitions(u.Transitions)
			for _, t := range u.Transitions {
				logger.Info("GPU health changed", "gpu", t.Device.UUID, "index", t.Device.Index, "from", t.From, "to", t.To, "reason", t.Reason)
			}
		}
	})
	if rem != nil {
		g.Go(func() error {
			// Claims are matched to GPUs through the DRA devices: the cache must be filled first.
			if err := caches.devices.Start(ctx); err != nil {
				return fmt.Errorf("remediation: %w", err)
			}
			return rem.Run(ctx)
		})
	}
	if evictor != nil {
		g.Go(func() error {
			if err := startEvictor(ctx); err != nil {
				return fmt.Errorf("eviction: %w", err)
			}
			return evictor.Run(ctx)
		})
	}
	drains := &drainWatcher{nodes: caches.nodes, monitor: monitor, clock: opts.Clock, recorder: recorder, nodeRef: nodeRef}
	g.Go(func() error { return drains.run(ctx) })
	clears := &clearWatcher{nodes: caches.nodes, client: opts.Client, monitor: monitor, clock: opts.Clock, recorder: recorder, nodeRef: nodeRef}
	g.Go(func() error { return clears.run(ctx) })
	if label := agentCfg.NVLinkDomainLabel; label != "-" {
		peers := &peerResolver{client: opts.Client, nodes: caches.nodes, label: label, monitor: monitor, clock: opts.Clock}
		g.Go(func() error { return peers.run(ctx) })
	}
	if opts.MetricsAddress != "" {
		g.Go(func() error { return serve(ctx, opts, writers, rt.CheckpointSaved) })
	}
	logger.Info("Agent started", "gpus", len(opts.Backend.Devices()), "missingGPUs", len(opts.Missing), "reporters", agentCfg.Reporters, "bootID", opts.BootID)
	return g.Wait()
}

// sharedCaches are the informer caches every reporter reads.
type sharedCaches struct {
	nodes   *nodecache.Cache
	devices *dradevices.Index
	// sharedNode is set when nodes is the caller's (Options.Nodes): it is not shut down here.
	sharedNode bool
}

// shutdown waits for the informers' goroutines once the agent's context is done. Shutting down
// a cache that never started returns at once.
func (c sharedCaches) shutdown() {
	if !c.sharedNode {
		c.nodes.Shutdown()
	}
	c.devices.Shutdown()
}

func newWriters(opts Options, cfg config.AgentConfig, caches sharedCaches, m *metrics.Metrics, recorder record.EventRecorder, nodeRef *corev1.ObjectReference) ([]*report.Writer, error) {
	wopts := report.WriterOptions{Resync: time.Duration(*cfg.Resync), Clock: opts.Clock, Observer: m}
	var (
		writers         []*report.Writer
		conditionWriter *report.Writer // set below; the breaker nudges it when its state changes
		cb              *breaker.Breaker
	)
	if cfg.CircuitBreaker.Enabled {
		cb = breaker.New(opts.Client, opts.NodeName, breaker.Options{
			Namespace: cfg.CircuitBreaker.Namespace, MaxFraction: cfg.CircuitBreaker.MaxFraction,
			Window: time.Duration(*cfg.CircuitBreaker.Window), Clock: opts.Clock,
		})
		m.BreakerHeld(0) // closed until it holds a GPU back: the gauge exists from the start
	}
	heldChanged := func(held []string) {
		m.BreakerHeld(len(held))
		if len(held) > 0 {
			recorder.Eventf(nodeRef, corev1.EventTypeWarning, "CircuitBreakerOpen",
				"%d GPUs are tainted None instead of NoSchedule/NoExecute: more than %.0f%% of the cluster's GPUs failed within %v (%v); run `gpuhealth breaker ack` to let them through",
				len(held), 100*cfg.CircuitBreaker.MaxFraction, time.Duration(*cfg.CircuitBreaker.Window), held)
		} else {
			recorder.Eventf(nodeRef, corev1.EventTypeNormal, "CircuitBreakerClosed", "no GPU of this node is held back any more")
		}
		if conditionWriter != nil {
			conditionWriter.Trigger()
		}
	}
	// One reporter carries the node's heartbeat, so that it costs one write per period: the
	// condition reporter (lastHeartbeatTime and the annotation in one patch), else the
	// annotation reporter.
	beat := report.NewHeartbeat(time.Duration(*cfg.Heartbeat))
	beatOwner := config.ReporterCondition
	if !slices.Contains(cfg.Reporters, beatOwner) {
		beatOwner = config.ReporterAnnotation
	}
	beatFor := func(name string) report.Heartbeat {
		if name == beatOwner {
			return beat
		}
		return report.Heartbeat{}
	}
	for _, name := range cfg.Reporters {
		var s report.Syncer
		switch name {
		case config.ReporterAnnotation:
			s = annotation.New(opts.Client, opts.NodeName, annotation.Options{Nodes: caches.nodes, Heartbeat: beatFor(name), Clock: opts.Clock})
		case config.ReporterDeviceTaint:
			s = devicetaint.New(opts.Client, opts.NodeName, devicetaint.Options{
				Driver: cfg.DriverName, UUIDAttribute: cfg.UUIDAttribute, ParentUUIDAttribute: cfg.ParentUUIDAttribute,
				PCIBusIDAttribute: cfg.PCIBusIDAttribute, Devices: caches.devices, NoExecute: cfg.NoExecute,
				Unmatched: func(d health.DeviceStatus) {
					m.Unmatched("devicetaint")
					recorder.Eventf(nodeRef, corev1.EventTypeWarning, "NoDRADevice",
						"GPU %d (%s) is %s but no device of driver %s on this node has %s=%s; it cannot be tainted",
						d.Device.Index, d.Device.UUID, d.Health, cfg.DriverName, cfg.UUIDAttribute, d.Device.UUID)
				},
				NameTaken: func(name, holder string) {
					recorder.Eventf(nodeRef, corev1.EventTypeWarning, "DeviceTaintRuleNameTaken",
						"the DeviceTaintRule name %s is held by a rule labelled for node %q, which this node's agent may not change; this node's rule is created under a generated name instead (see its %s annotation)",
						name, holder, devicetaint.KeyAnnotation)
				},
				Breaker:     breakerOrNil(cb),
				HeldChanged: heldChanged,
				Relist:      time.Duration(*cfg.Resync),
				Clock:       opts.Clock,
			})
		case config.ReporterCondition:
			o := nodecondition.Options{Nodes: caches.nodes, Clock: opts.Clock, RebootRequired: opts.Remediation.Config.Enabled, Heartbeat: beatFor(name)}
			if cb != nil { // a nil *Breaker must not become a non-nil interface
				o.Breaker = cb
			}
			s = nodecondition.New(opts.Client, opts.NodeName, o)
		case config.ReporterHAMi:
			s = hami.New(opts.Client, opts.NodeName, hami.Options{Nodes: caches.nodes})
		case config.ReporterClaimStatus:
			s = claimstatus.New(opts.Client, opts.NodeName, claimstatus.Options{Driver: cfg.DriverName, UUIDAttribute: cfg.UUIDAttribute,
				ParentUUIDAttribute: cfg.ParentUUIDAttribute, PCIBusIDAttribute: cfg.PCIBusIDAttribute, Devices: caches.devices, Clock: opts.Clock})
		default:
			return nil, fmt.Errorf("agent: unknown reporter %q", name)
		}
		m.Reporter(name, name == config.ReporterDeviceTaint)
		w := report.NewWriter(s, wopts)
		if name == config.ReporterCondition {
			conditionWriter = w
		}
		writers = append(writers, w)
	}
	return writers, nil
}

// draAttributes are the DRA device attribute names the agent matches GPUs by.
func draAttributes(cfg config.AgentConfig) dradevices.Attributes {
	return dradevices.Attributes{UUID: cfg.UUIDAttribute, ParentUUID: cfg.ParentUUIDAttribute, PCIBusID: cfg.PCIBusIDAttribute}
}

// breakerOrNil keeps a nil *Breaker from becoming a non-nil interface.
func breakerOrNil(b *breaker.Breaker) devicetaint.Breaker {
	if b == nil {
		return nil
	}
	return b
}

// meteredSink feeds the monitor, leaving out XIDs the kernel log already reported, and
// measures how long signals waited.
type meteredSink struct {
	monitor   *health.Monitor
	metrics   *metrics.Metrics
	clock     clock.PassiveClock
	kernelLog *KernelLog
	// onReset, when set, hears of every GPU reset the backend reports (remediation verifies its
	// resets by them).
	onReset func(uuid string, at time.Time)
}

func (s *meteredSink) Signal(sig health.Signal) {
	if !s.kernelLog.Admit(sig) {
		return
	}
	s.monitor.Signal(sig)
	s.metrics.ObserveSignal(sig.Time, s.clock.Now())
	if sig.Kind == health.SignalReset && s.onReset != nil {
		s.onReset(sig.Device, sig.Time)
	}
}

func (s *meteredSink) Reboot(bootID string, at time.Time) { s.monitor.Reboot(bootID, at) }

// SetCheckUnmonitored forwards what the NVML backend cannot watch on a GPU (a missing driver
// function, ECC off) to the monitor, so snapshots and reporters show it.
func (s *meteredSink) SetCheckUnmonitored(uuid string, c health.Check, unmonitored bool) {
	s.monitor.SetCheckUnmonitored(uuid, c, unmonitored)
}

func (s *meteredSink) SetUnmonitored(uuid string, unmonitored bool) {
	s.monitor.SetUnmonitored(uuid, unmonitored)
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
