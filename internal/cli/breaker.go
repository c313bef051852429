package cli

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// LeaderElectionLease is the Lease the breaker controller's replicas elect a leader with.
const LeaderElectionLease = "gpuhealth-breaker-controller"

func newBreakerCommand() *cobra.Command {
	var kubeconfig, namespace string
	var window time.Duration
	cmd := &cobra.Command{
		Use:   "breaker ack|status|controller",
		Short: "Inspect or acknowledge the circuit breaker that holds back disruptive taints in a mass failure",
		Long: `When more than the configured share of the cluster's GPUs would turn NoSchedule or NoExecute
within the window (agent.circuitBreaker in the HealthConfig), the agents taint further GPUs None
instead and say so (Event CircuitBreakerOpen, Node condition GPUCircuitBreakerOpen, metric
gpuhealth_circuit_breaker_held_gpus). "breaker status" lists the GPUs admitted to the budget;
"breaker ack" tells the agents the wave is understood: admissions so far stop counting, and held
GPUs get their effects. "breaker controller" keeps the cluster's GPU count for the agents (the
chart runs it when the breaker is on).`,
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster's GPU count and the GPUs admitted to NoSchedule/NoExecute",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := newUserClient(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			return breakerStatus(cmd.Context(), client, namespace, window, cmd.OutOrStdout())
		},
	}
	status.Flags().DurationVar(&window, "window", config.DefaultBreakerWindow, "the agents' circuitBreaker.window, to tell which admissions still count")
	ack := &cobra.Command{
		Use:   "ack",
		Short: "Acknowledge the current wave: held GPUs get their NoSchedule/NoExecute effects",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := newUserClient(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			at, err := breaker.Acknowledge(cmd.Context(), adapt.Clientset(client), namespace, time.Now())
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "acknowledged at %s (the API server's time): the agents let held GPUs through\n", at.Format(time.RFC3339))
			return err
		},
	}
	for _, c := range []*cobra.Command{status, ack} {
		c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
		c.Flags().StringVarP(&namespace, "namespace", "n", config.DefaultBreakerNamespace, "namespace of the agents' circuit breaker")
	}
	cmd.AddCommand(status, ack, newBreakerControllerCommand())
	return cmd
}

func breakerStatus(ctx context.Context, client kubernetes.Interface, namespace string, window time.Duration, out interface{ Write([]byte) (int, error) }) error {
	var total int
	var acknowledged time.Time
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		total, acknowledged = breaker.ParseState(cm)
	}
	slots, err := breaker.ListSlots(ctx, adapt.Clientset(client), namespace)
	if err != nil {
		return err
	}
	if total > 0 {
		fmt.Fprintf(out, "cluster GPUs: %d (counted %s)\n", total, cmp.Or(cm.Data[breaker.CountedAtKey], "<unknown>"))
	} else {
		fmt.Fprintln(out, "cluster GPUs: unknown; the agents admit every escalation (is `gpuhealth breaker controller` running?)")
	}
	ack := "<never>"
	if !acknowledged.IsZero() {
		ack = acknowledged.Format(time.RFC3339)
	}
	fmt.Fprintf(out, "acknowledged at: %s\n", ack)
	cutoff := breaker.Cutoff(time.Now(), window, acknowledged)
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "SLOT\tNODE\tGPU\tADMITTED\tCOUNTS")
	for _, s := range slots {
		counts := "no"
		if s.Live(cutoff) {
			counts = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", s.Index, s.Node, s.UUID, s.At.Format(time.RFC3339), counts)
	}
	return tw.Flush()
}

// Client limits of the breaker controller: one metadata watch of the Nodes, one ConfigMap write
// per change of the count, and the leader-election Lease.
const (
	breakerControllerQPS   = 20
	breakerControllerBurst = 40
)

func newBreakerControllerCommand() *cobra.Command {
	var (
		kubeconfig, namespace, metricsAddress, driver string
		capacityResources                             []string
		window, staleAfter                            time.Duration
		leaderElect                                   bool
		logs                                          logOptions
	)
	cmd := &cobra.Command{
		Use:   "controller [--kubeconfig FILE] [--namespace NS] [--leader-elect]",
		Short: "Keep the cluster's GPU count in the circuit breaker's ConfigMap and sweep stale slots (a Deployment; the chart runs it)",
		Long: `controller watches the Nodes and the DRA driver's ResourceSlices once for the whole cluster,
counts the physical GPUs the agents report in their gpuhealth.dev/gpu-health annotations (each
node at most what its ResourceSlices or GPU capacity say, a node whose agent's heartbeat is older
than --stale-after not at all), and writes the count into the
ConfigMap gpuhealth-circuit-breaker, from which every agent computes the breaker's budget. It
also deletes the slots that stopped counting: the breaker's once they leave --window (or an
acknowledgement), remediation's once they expire (agents may delete only their own). With
--leader-elect (default) its replicas elect one leader through the Lease ` + LeaderElectionLease + `.
--metrics-address serves /healthz (failing when a leader stopped renewing its lease) and /metrics
(gpuhealth_breaker_cluster_gpus, gpuhealth_breaker_leader, gpuhealth_breaker_slots_swept_total).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if window <= 0 {
				return cmdutil.BadInput(fmt.Errorf("--window must be positive, not %v", window))
			}
			cfg, err := cmdutil.ComponentConfig(kubeconfig, "gpuhealth-breaker-controller", breakerControllerQPS, breakerControllerBurst)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			kc := adapt.Clientset(client)
			m := breaker.NewControllerMetrics()
			counter := &breaker.Counter{Client: kc, Namespace: namespace, Driver: driver, CapacityResources: capacityResources, StaleAfter: staleAfter,
				Counted: func(n int) { m.ClusterGPUs.Set(float64(n)) }, Stale: func(n int) { m.StaleNodes.Set(float64(n)) }}
			sweeper := &breaker.Sweeper{
				Pools: []breaker.SweptPool{
					breaker.BreakerPool(breaker.BreakerSlots(kc, namespace), window, breaker.AcknowledgedAt(kc, namespace)),
					breaker.ExpiringPool(remediation.SlotPool(kc, namespace)),
				},
				Swept: func(prefix string, n int) { m.SlotsSwept.WithLabelValues(prefix).Add(float64(n)) },
			}
			work := func(ctx context.Context) error {
				g, ctx := errgroup.WithContext(ctx)
				g.Go(func() error { return counter.Run(ctx) })
				g.Go(func() error { return sweeper.Run(ctx) })
				return g.Wait()
			}
			watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
			g, ctx := errgroup.WithContext(ctx)
			if metricsAddress != "" {
				g.Go(func() error { return serveBreakerController(ctx, metricsAddress, m.Registry, watchdog) })
			}
			g.Go(func() error {
				if !leaderElect {
					m.Leader.Set(1)
					return work(ctx)
				}
				return runLeaderElected(ctx, breakerElection(client, namespace, breakerIdentity(), watchdog), func(ctx context.Context) error {
					m.Leader.Set(1)
					defer m.Leader.Set(0)
					return work(ctx)
				})
			})
			return g.Wait()
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVarP(&namespace, "namespace", "n", cmp.Or(os.Getenv("POD_NAMESPACE"), config.DefaultBreakerNamespace), "namespace of the circuit breaker's ConfigMap and slots (and remediation's slots)")
	f.DurationVar(&window, "window", config.DefaultBreakerWindow, "the agents' circuitBreaker.window: a breaker slot older than this is deleted")
	f.StringVar(&driver, "driver", "gpu.nvidia.com", "the DRA driver whose ResourceSlices bound each node's GPU count")
	f.DurationVar(&staleAfter, "stale-after", gpuhealthv1.DefaultStaleAfter, "a node whose agent's heartbeat is older (or unreadable) is left out of the count (0: count every node)")
	f.StringSliceVar(&capacityResources, "capacity-resources", breaker.DefaultCapacityResources, "extended resources whose capacity bounds each node's GPU count (a trailing * is a prefix)")
	f.BoolVar(&leaderElect, "leader-elect", true, "elect one leader among the replicas")
	f.StringVar(&metricsAddress, "metrics-address", ":9403", "address to serve /healthz and /metrics on (empty: none)")
	logs.addFlags(f)
	return cmd
}

// breakerElection is how the breaker controller's replicas elect their leader: through the Lease
// LeaderElectionLease in namespace, which identity holds while it leads.
func breakerElection(client kubernetes.Interface, namespace, identity string, watchdog *leaderelection.HealthzAdaptor) leaderelection.LeaderElectionConfig {
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

// breakerIdentity names this replica in the Lease: the pod's host name and a random suffix, so
// that a restarted container never mistakes its predecessor's lease for its own.
func breakerIdentity() string {
	host, _ := os.Hostname()
	return host + "_" + uuid.NewString()
}

// runLeaderElected campaigns with cfg (whose Callbacks it sets) and runs run while this process
// leads. It returns when ctx is done, when run returns, or when the lead is lost (the Deployment
// restarts the container, which then campaigns again); in every case only once run has
// returned, with run's error if it failed.
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

// serveBreakerController serves /healthz and /metrics until ctx is done.
func serveBreakerController(ctx context.Context, addr string, registry *prometheus.Registry, watchdog *leaderelection.HealthzAdaptor) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := watchdog.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return cmdutil.BadInput(fmt.Errorf("--metrics-address: %w", err))
	}
	return httpserve.Serve(ctx, lis, mux)
}
