// Package controller runs gpuhealth's breaker controller (`gpuhealth breaker controller`, a
// Deployment the chart runs when the circuit breaker is on): leader-elected, it keeps the
// cluster's GPU count in the breaker's ConfigMap (breaker.Counter) and sweeps the slots that
// stopped counting (breaker.Sweeper), and, with SharedCauses, judges what the fleet's GPU faults
// share (internal/fleet/watch), and, with Records, keeps every GPU's life by serial
// (internal/fleet/records); and serves /healthz and /metrics. It is a package of its
// own, not part of package breaker, because leader election needs client-go's full clientset,
// which the agent binary (which imports package breaker) must not link
// (cmd/gpuhealth-agent's TestAgentLinksNoFullClientset).
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/fleet/records"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/silence"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// LeaderElectionLease is the Lease the breaker controller's replicas elect a leader with.
const LeaderElectionLease = "gpuhealth-breaker-controller"

// Options configure Run. Client, Namespace and a positive Window are required.
type Options struct {
	Client kubernetes.Interface
	// Namespace holds the breaker's ConfigMap, its slots and the leader-election Lease.
	Namespace string
	// Driver is the DRA driver whose ResourceSlices bound each node's GPU count.
	Driver string
	// CapacityResources are the extended resources whose capacity bounds each node's GPU count
	// (default breaker.DefaultCapacityResources).
	CapacityResources []string
	// Window is the agents' circuitBreaker.window: a breaker slot older than this is deleted.
	Window time.Duration
	// StaleAfter leaves a node whose agent's heartbeat is older out of the count (0: count every
	// node).
	StaleAfter time.Duration
	// AgentSilence marks the nodes whose agents went silent (package silence), judged with
	// StaleAfter (DefaultStaleAfter when StaleAfter is 0); SilentTaint taints them too.
	AgentSilence, SilentTaint bool
	// Domains are the circuit breaker's budgets per domain (agent.circuitBreaker.domains): their
	// GPUs are counted, and a full one reported once (breaker.DomainWatcher).
	Domains []breaker.Domain
	// MoreSlots are further slot pools to sweep (remediation's, whose package imports this one).
	MoreSlots []breaker.SweptPool
	// SharedCauses, when set, judges what the fleet's GPU faults share every period while this
	// replica leads, and publishes the verdict (a HealthConfig's fleet.sharedCauses, through
	// watch.SettingsFrom).
	SharedCauses *watch.Settings
	// Records, when set, keeps every GPU's life by board serial in GPURecords while this replica
	// leads (a HealthConfig's fleet.records; internal/fleet/records), at most MaxRecords of them
	// (0: records.DefaultMaxRecords).
	Records    kube.GPURecordInterface
	MaxRecords int
	// LeaderElect elects one leader among the replicas through LeaderElectionLease; without it
	// this replica counts and sweeps alone.
	LeaderElect bool
	// Identity names this replica in the Lease (default: the host name and a random suffix).
	Identity string
	// MetricsAddress serves /healthz (failing while a leader stopped renewing its Lease) and
	// /metrics; empty serves nothing.
	MetricsAddress string
	// Ready, when set, is called with the server's address once it listens (tests use ":0").
	Ready func(addr string)
}

// Run runs the breaker controller until ctx is done, the lead is lost (the Deployment
// restarts the container, which then campaigns again) or a loop fails: while it leads, a
// breaker.Counter keeps the cluster's GPU count in the breaker's ConfigMap and a breaker.Sweeper
// deletes the slots that stopped counting (and the other loops opts turn on run beside them).
func Run(ctx context.Context, opts Options) error {
	if opts.Client == nil || opts.Namespace == "" {
		return errors.New("breaker controller: a client and a namespace are required")
	}
	if opts.Window <= 0 {
		return fmt.Errorf("breaker controller: the window must be positive, not %v", opts.Window)
	}
	if opts.Identity == "" {
		opts.Identity = replicaIdentity()
	}
	if opts.CapacityResources == nil {
		opts.CapacityResources = breaker.DefaultCapacityResources
	}
	kc := adapt.Clientset(opts.Client)
	m := breaker.NewControllerMetrics()
	counter := &breaker.Counter{Client: kc, Namespace: opts.Namespace, Driver: opts.Driver, CapacityResources: opts.CapacityResources, StaleAfter: opts.StaleAfter,
		Counted: func(n int) { m.ClusterGPUs.Set(float64(n)) }, Stale: func(n int) { m.StaleNodes.Set(float64(n)) }, Domains: opts.Domains}
	sweeper := &breaker.Sweeper{
		Pools: append([]breaker.SweptPool{breaker.BreakerPool(breaker.BreakerSlots(kc, opts.Namespace), opts.Window, breaker.AcknowledgedAt(kc, opts.Namespace))}, opts.MoreSlots...),
		Swept: func(prefix string, n int) { m.SlotsSwept.WithLabelValues(prefix).Add(float64(n)) },
	}
	silent, stopEvents, err := silenceWatcher(ctx, opts, m)
	if err != nil {
		return err
	}
	defer stopEvents()
	domains, stopDomainEvents := domainWatcher(ctx, opts, m)
	defer stopDomainEvents()
	fleet, stopFleetEvents, err := fleetWatcher(ctx, opts, m)
	if err != nil {
		return err
	}
	defer stopFleetEvents()
	work := func(ctx context.Context) error {
		m.Leader.Set(1)
		defer m.Leader.Set(0)
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error { return counter.Run(ctx) })
		g.Go(func() error { return sweeper.Run(ctx) })
		g.Go(func() error { return domains.Run(ctx) })
		if silent != nil {
			g.Go(func() error { return silent.Run(ctx) })
		}
		if fleet != nil {
			g.Go(func() error { return fleet.Run(ctx) })
		}
		if opts.Records != nil {
			rc := &records.Controller{Client: kc, Records: opts.Records, MaxRecords: opts.MaxRecords,
				Written: func(created bool) { m.RecordsWritten.WithLabelValues(strconv.FormatBool(created)).Inc() }}
			g.Go(func() error { return rc.Run(ctx) })
		}
		return g.Wait()
	}
	watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	g, ctx := errgroup.WithContext(ctx)
	if opts.MetricsAddress != "" {
		g.Go(func() error { return serveController(ctx, opts, m.Registry, watchdog) })
	}
	g.Go(func() error {
		if !opts.LeaderElect {
			return work(ctx)
		}
		return runLeaderElected(ctx, election(opts.Client, opts.Namespace, opts.Identity, watchdog), work)
	})
	return g.Wait()
}

// silenceWatcher returns the agent silence watcher opts ask for (nil when off), posting its
// Events through a broadcaster that stop ends.
func silenceWatcher(ctx context.Context, opts Options, m *breaker.ControllerMetrics) (*silence.Watcher, func(), error) {
	if !opts.AgentSilence {
		return nil, func() {}, nil
	}
	kc := adapt.Clientset(opts.Client)
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(kube.EventSink{Client: kc})
	w, err := silence.New(silence.Options{
		Client: kc, Namespace: opts.Namespace, StaleAfter: cmp.Or(opts.StaleAfter, gpuhealthv1.DefaultStaleAfter), Taint: opts.SilentTaint,
		Recorder: broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "gpuhealth-breaker-controller"}),
		Silent:   func(n int) { m.SilentNodes.Set(float64(n)) }, Marked: m.Silences.Inc,
	})
	if err != nil {
		broadcaster.Shutdown()
		return nil, nil, err
	}
	return w, broadcaster.Shutdown, nil
}

// domainWatcher returns the breaker's DomainWatcher (it sweeps domain slots even without
// domains configured), posting its Events through a broadcaster that stop ends.
func domainWatcher(ctx context.Context, opts Options, m *breaker.ControllerMetrics) (*breaker.DomainWatcher, func()) {
	kc := adapt.Clientset(opts.Client)
	w := &breaker.DomainWatcher{Client: kc, Namespace: opts.Namespace, Window: opts.Window, Domains: opts.Domains, Full: m.SetDomainFull,
		Swept: func(n int) { m.SlotsSwept.WithLabelValues(breaker.SlotPrefix + "<domain>-").Add(float64(n)) }}
	if len(opts.Domains) == 0 {
		return w, func() {}
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(kube.EventSink{Client: kc})
	w.Recorder = broadcaster.NewRecorder(kube.Scheme, corev1.EventSource{Component: "gpuhealth-breaker-controller"})
	return w, broadcaster.Shutdown
}

// election is how the breaker controller's replicas elect their leader: through the Lease
// LeaderElectionLease in namespace, which identity holds while it leads.
func election(client kubernetes.Interface, namespace, identity string, watchdog *leaderelection.HealthzAdaptor) leaderelection.LeaderElectionConfig {
	return leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaderElectionLease},
			Client:     client.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		},
		ReleaseOnCancel: true,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		Name:            LeaderElectionLease,
		WatchDog:        watchdog,
	}
}

// replicaIdentity names this replica in the Lease: the pod's host name and a random suffix, so
// that a restarted container never mistakes its predecessor's lease for its own.
func replicaIdentity() string {
	host, _ := os.Hostname()
	return host + "_" + uuid.NewString()
}

// runLeaderElected campaigns with cfg (whose Callbacks it sets) and runs run while this process
// leads. It returns when ctx is done, when run returns, or when the lead is lost; in every case
// only once run has returned, with run's error if it failed.
func runLeaderElected(ctx context.Context, cfg leaderelection.LeaderElectionConfig, run func(context.Context) error) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var work leaderWork
	cfg.Callbacks = leaderelection.LeaderCallbacks{
		OnStartedLeading: func(leadCtx context.Context) {
			defer cancel() // the work is over: stop renewing the lease, so that Run returns
			work.do(leadCtx, run)
		},
		OnStoppedLeading: cancel,
	}
	le, err := leaderelection.NewLeaderElector(cfg)
	if err != nil {
		return err
	}
	le.Run(ctx)
	if err := work.wait(); err != nil {
		return err
	}
	if parent.Err() == nil {
		return fmt.Errorf("lost the lead (Lease %s)", cfg.Lock.Describe())
	}
	return nil
}

// leaderWork owns the work OnStartedLeading runs. client-go calls that callback in a goroutine
// that LeaderElector.Run does not wait for, so the work registers here and wait, called once Run
// has returned, waits for it and hands over its error; work that would start only after wait
// began does not start at all.
type leaderWork struct {
	mu      sync.Mutex
	waiting bool
	err     error
	running sync.WaitGroup
}

// do runs run with ctx, unless wait has begun, and keeps its error for wait.
func (w *leaderWork) do(ctx context.Context, run func(context.Context) error) {
	var start bool
	w.locked(func() {
		if start = !w.waiting; start {
			w.running.Add(1)
		}
	})
	if !start {
		return
	}
	defer w.running.Done()
	err := run(ctx)
	w.locked(func() { w.err = err })
}

// wait returns once the work, if it started, has returned, with its error.
func (w *leaderWork) wait() (err error) {
	w.locked(func() { w.waiting = true })
	w.running.Wait()
	w.locked(func() { err = w.err })
	return err
}

func (w *leaderWork) locked(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
}

// ErrListen wraps a failure to listen on Options.MetricsAddress.
var ErrListen = errors.New("cannot listen")

// serveController serves /healthz and /metrics until ctx is done.
func serveController(ctx context.Context, opts Options, registry *prometheus.Registry, watchdog *leaderelection.HealthzAdaptor) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := watchdog.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", opts.MetricsAddress)
	if err != nil {
		return fmt.Errorf("%w on %s: %w", ErrListen, opts.MetricsAddress, err)
	}
	if opts.Ready != nil {
		opts.Ready(lis.Addr().String())
	}
	return httpserve.Serve(ctx, lis, mux)
}
