package agent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/dra"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/cache/dradevices"
	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/evict"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/podresources"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/annotation"
	"github.com/gpuhealth/gpuhealth/internal/report/claimstatus"
	"github.com/gpuhealth/gpuhealth/internal/report/devicetaint"
	"github.com/gpuhealth/gpuhealth/internal/report/hami"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/internal/report/nodecondition"
	"github.com/gpuhealth/gpuhealth/internal/report/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// wiring is everything the agent's loops share, built once by wire before any loop starts: what
// the parts of the agent need from each other, in one place instead of in parameter lists.
type wiring struct {
	opts Options
	cfg  config.AgentConfig // opts.Agent with its defaults

	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference
	// stopEvents flushes and stops the Event broadcaster.
	stopEvents func()

	rt      *health.Runtime
	monitor *health.Monitor
	metrics *metrics.Metrics
	caches  sharedCaches
	// writerOptions are every Writer's: the resync period, the clock, the metrics.
	writerOptions report.WriterOptions

	// writers are all the reporters' Writers, the remediation annotation's included.
	writers []*report.Writer
	// rem resets GPUs (nil when remediation is off); fan is told when its repair states change.
	rem *remediation.Controller
	// evictor evicts the pods of GPUs that ask for it (nil when eviction is off); startEvictor
	// runs before its Run.
	evictor      *evict.Evictor
	startEvictor func(context.Context) error
	fan          *fanOut
}

// wire builds the agent's parts for opts (checked and defaulted by Run): the Event recorder,
// the health runtime restored from its checkpoint (or the Node's report), the metrics, the
// shared caches, the writers, remediation, eviction and the fan-out. Call close when done.
func wire(ctx context.Context, opts Options) (_ *wiring, err error) {
	w := &wiring{opts: opts, cfg: opts.Agent.WithDefaults()}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(kube.EventSink{Client: opts.Client})
	w.stopEvents = broadcaster.Shutdown
	w.recorder = broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "gpuhealth-agent", Host: opts.NodeName})
	w.nodeRef = &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: opts.NodeName}

	if err := w.restoreRuntime(ctx); err != nil {
		return nil, err
	}
	// Metrics show GPUs under repair as the reporters do (w.rem is set below, before the server
	// that scrapes them starts).
	tracker := w.monitor.Tracker()
	w.metrics = metrics.New(opts.NodeName, func() health.Snapshot {
		if w.rem != nil {
			return w.rem.Decorate(tracker.Snapshot())
		}
		return tracker.Snapshot()
	})
	if err := w.metrics.Register(opts.Registry); err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	backendSource, _ := opts.Backend.(metrics.Backend)
	if err := opts.Registry.Register(metrics.NewSources(opts.NodeName, opts.KernelLog, backendSource)); err != nil {
		return nil, fmt.Errorf("agent: register metrics: %w", err)
	}
	w.writerOptions = report.WriterOptions{Resync: time.Duration(*w.cfg.Resync), Clock: opts.Clock, Observer: w.metrics}

	// One cache of the Node and one of its DRA devices, shared by every reporter and the drains
	// watcher: one watch of each per agent.
	attrs := draAttributes(w.cfg)
	if err := attrs.Validate(); err != nil {
		return nil, fmt.Errorf("agent: DRA attribute names: %w", err)
	}
	w.caches = sharedCaches{
		nodes:      opts.Nodes,
		devices:    dradevices.NewWithAttributes(opts.Client, opts.NodeName, w.cfg.DriverName, attrs),
		sharedNode: opts.Nodes != nil,
	}
	if w.caches.nodes == nil {
		w.caches.nodes = nodecache.New(opts.Client, opts.NodeName)
	}

	if w.writers, err = w.newWriters(); err != nil {
		return nil, err
	}
	// Remediation tells the fan-out when repair states change, and adds its annotation's Writer:
	// the fan-out exists first, and takes its writers once they are all there.
	w.fan = newFanOut(w.metrics)
	rem, remWriter, err := w.newRemediation(ctx)
	if err != nil {
		return nil, err
	}
	if rem != nil {
		w.rem, w.fan.rem = rem, rem
		w.writers = append(w.writers, remWriter)
	}
	if w.evictor, w.startEvictor, err = w.newEvictor(); err != nil {
		return nil, err
	}
	w.fan.evictor = w.evictor
	scheduling, following := splitBySchedulerPath(w.writers)
	after := newFollowers(following, nodecondition.NewEvents(w.recorder, opts.NodeName, ""))
	after.delivered = w.caches.nodes.WaitCaughtUp
	w.fan.scheduling, w.fan.followers = scheduling, after
	return w, nil
}

// restoreRuntime builds the health runtime and restores it: from the checkpoint, then from this
// agent's report on its Node where the checkpoint is missing or older.
func (w *wiring) restoreRuntime(ctx context.Context) error {
	opts := w.opts
	checkpointPath := w.cfg.CheckpointPath
	if checkpointPath == "-" {
		checkpointPath = ""
	}
	rt, err := health.NewRuntime(opts.Policy, slices.Concat(opts.Backend.Devices(), opts.Missing), health.RuntimeOptions{
		Clock: opts.Clock, CheckpointPath: checkpointPath, BootID: opts.BootID,
	})
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	w.rt, w.monitor = rt, rt.Monitor()
	opts.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "gpuhealth_checkpoint_write_failures_total",
		Help:        "Checkpoint writes that failed (each is tried again every tick; the agent is not ready while the last one failed).",
		ConstLabels: prometheus.Labels{"node": opts.NodeName},
	}, func() float64 { return float64(rt.CheckpointFailures()) }))
	logger := klog.FromContext(ctx)
	restored, err := rt.Restore()
	if err != nil {
		logger.Error(err, "Ignoring the checkpoint", "path", checkpointPath)
		w.recorder.Eventf(w.nodeRef, corev1.EventTypeWarning, "CheckpointIgnored", "gpuhealth ignored its checkpoint %s: %v", checkpointPath, err)
	} else if restored {
		logger.Info("Restored the checkpoint", "path", checkpointPath)
	}
	restoreFromNodeReport(ctx, opts, w.monitor, checkpointPath, restored)
	return nil
}

// close stops what wire started: the caches' informers (once the agent's context is done) and
// the Event broadcaster.
func (w *wiring) close() {
	if w.caches.devices != nil {
		w.caches.shutdown()
	}
	if w.stopEvents != nil {
		w.stopEvents()
	}
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

// newWriters builds one Writer per configured reporter, in the configured order.
func (w *wiring) newWriters() ([]*report.Writer, error) {
	opts, cfg, m, recorder, nodeRef := w.opts, w.cfg, w.metrics, w.recorder, w.nodeRef
	var (
		writers         []*report.Writer
		conditionWriter *report.Writer // set below; the breaker nudges it when its state changes
		cb              *breaker.Breaker
		// gate is cb as the devicetaint and condition reporters share it: one question at a
		// time (one slot a GPU), and the repair condition told when the breaker changes.
		gate *nodecondition.BreakerGate
	)
	if cfg.CircuitBreaker.Enabled {
		cb = w.newBreaker()
		gate = nodecondition.NewBreakerGate(cb, func() {
			if conditionWriter != nil {
				conditionWriter.Trigger()
			}
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
	// No reporter carries a heartbeat: the agent renews a Lease of its own (internal/heartbeat,
	// started by Run), and writes the Node only when its GPUs' health changes.
	for _, name := range cfg.Reporters {
		var s report.Syncer
		switch name {
		case config.ReporterAnnotation:
			s = annotation.New(opts.Client, opts.NodeName, annotation.Options{Nodes: w.caches.nodes})
		case config.ReporterDeviceTaint:
			s = devicetaint.New(opts.Client, opts.NodeName, devicetaint.Options{
				Driver: cfg.DriverName, UUIDAttribute: cfg.UUIDAttribute, ParentUUIDAttribute: cfg.ParentUUIDAttribute,
				PCIBusIDAttribute: cfg.PCIBusIDAttribute, Devices: w.caches.devices, NoExecute: cfg.NoExecute,
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
				Breaker:     breakerOrNil(gate),
				HeldChanged: heldChanged,
				Relist:      time.Duration(*cfg.Resync),
				Clock:       opts.Clock,
			})
		case config.ReporterCondition:
			o := nodecondition.Options{Nodes: w.caches.nodes, Clock: opts.Clock, RebootRequired: opts.Remediation.Config.Enabled}
			o.Repair = cfg.RepairCondition
			if gate != nil { // a nil *BreakerGate must not become a non-nil interface
				o.Breaker = gate
			}
			s = nodecondition.New(opts.Client, opts.NodeName, o)
		case config.ReporterHAMi:
			s = hami.New(opts.Client, opts.NodeName, hami.Options{Nodes: w.caches.nodes})
		case config.ReporterClaimStatus:
			s = claimstatus.New(opts.Client, opts.NodeName, claimstatus.Options{Driver: cfg.DriverName, UUIDAttribute: cfg.UUIDAttribute,
				ParentUUIDAttribute: cfg.ParentUUIDAttribute, PCIBusIDAttribute: cfg.PCIBusIDAttribute, Devices: w.caches.devices, Clock: opts.Clock,
				PodResources: podresources.Socket{Path: cfg.ClaimStatus.PodResourcesSocket}, PodWatch: cfg.ClaimStatus.PodWatch, Nodes: w.caches.nodes,
				Unavailable: func(why string) { recorder.Event(nodeRef, corev1.EventTypeWarning, claimstatus.EventUnavailable, why) },
				Unmarked:    func() { m.Unmatched(name) },
			})
		case config.ReporterNVSentinel:
			nm := metrics.NewNVSentinel(opts.NodeName)
			if err := nm.Register(opts.Registry); err != nil {
				return nil, fmt.Errorf("agent: register metrics: %w", err)
			}
			s = nvsentinel.New(opts.NodeName, nvsentinel.Options{Config: cfg.NVSentinel, RemediationEnabled: opts.Remediation.Config.Enabled, Clock: opts.Clock, Observer: nm})
		default:
			return nil, fmt.Errorf("agent: unknown reporter %q", name)
		}
		m.Reporter(name, name == config.ReporterDeviceTaint)
		wr := report.NewWriter(s, w.writerOptions)
		if name == config.ReporterCondition {
			conditionWriter = wr
		}
		writers = append(writers, wr)
	}
	return writers, nil
}

// newBreaker returns a circuit breaker as agent.circuitBreaker says (it must be enabled).
func (w *wiring) newBreaker() *breaker.Breaker {
	cb := w.cfg.CircuitBreaker
	opts := breaker.Options{Namespace: cb.Namespace, MaxFraction: cb.MaxFraction, Window: time.Duration(*cb.Window), Clock: w.opts.Clock}
	for _, d := range cb.Domains {
		opts.Domains = append(opts.Domains, breaker.Domain{Label: d.Label, MaxFraction: d.MaxFraction})
	}
	if len(opts.Domains) > 0 {
		opts.NodeLabels = func(ctx context.Context) (map[string]string, error) {
			n, err := w.caches.nodes.Get(ctx)
			if err != nil {
				return nil, err
			}
			return n.Labels, nil
		}
	}
	return breaker.New(w.opts.Client, w.opts.NodeName, opts)
}

// draAttributes are the DRA device attribute names the agent matches GPUs by.
func draAttributes(cfg config.AgentConfig) dra.Attributes {
	return dra.Attributes{UUID: cfg.UUIDAttribute, ParentUUID: cfg.ParentUUIDAttribute, PCIBusID: cfg.PCIBusIDAttribute}
}

// breakerOrNil keeps a nil *BreakerGate from becoming a non-nil interface.
func breakerOrNil(b *nodecondition.BreakerGate) devicetaint.Breaker {
	if b == nil {
		return nil
	}
	return b
}
