package cli

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/httpserve"
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
				return badInput(err)
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
				return badInput(err)
			}
			if err := breaker.Acknowledge(cmd.Context(), client, namespace, time.Now()); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "acknowledged: the agents let held GPUs through")
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
	slots, err := breaker.ListSlots(ctx, client, namespace)
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
		kubeconfig, namespace, metricsAddress string
		leaderElect                           bool
		logs                                  logOptions
	)
	cmd := &cobra.Command{
		Use:   "controller [--kubeconfig FILE] [--namespace NS] [--leader-elect]",
		Short: "Keep the cluster's GPU count in the circuit breaker's ConfigMap (a Deployment; the chart runs it)",
		Long: `controller watches the Nodes' metadata once for the whole cluster, counts the physical GPUs the
agents report in their gpuhealth.dev/gpu-health annotations, and writes the count into the
ConfigMap gpuhealth-circuit-breaker, from which every agent computes the breaker's budget. With
--leader-elect (default) its replicas elect one leader through the Lease ` + LeaderElectionLease + `.
--metrics-address serves /healthz (failing when a leader stopped renewing its lease) and /metrics
(gpuhealth_breaker_cluster_gpus, gpuhealth_breaker_leader).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			cfg, err := componentConfig(kubeconfig, "gpuhealth-breaker-controller", breakerControllerQPS, breakerControllerBurst)
			if err != nil {
				return badInput(err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return badInput(err)
			}
			meta, err := metadata.NewForConfig(cfg)
			if err != nil {
				return badInput(err)
			}
			m := newBreakerControllerMetrics()
			counter := &breaker.Counter{Client: client, Metadata: meta, Namespace: namespace, Counted: func(n int) { m.gpus.Set(float64(n)) }}
			watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
			g, ctx := errgroup.WithContext(ctx)
			if metricsAddress != "" {
				g.Go(func() error { return serveBreakerController(ctx, metricsAddress, m.registry, watchdog) })
			}
			g.Go(func() error {
				if !leaderElect {
					m.leader.Set(1)
					return counter.Run(ctx)
				}
				return runLeaderElected(ctx, client, namespace, watchdog, func(ctx context.Context) error {
					m.leader.Set(1)
					defer m.leader.Set(0)
					return counter.Run(ctx)
				})
			})
			return g.Wait()
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVarP(&namespace, "namespace", "n", cmp.Or(os.Getenv("POD_NAMESPACE"), config.DefaultBreakerNamespace), "namespace of the circuit breaker's ConfigMap and slots")
	f.BoolVar(&leaderElect, "leader-elect", true, "elect one leader among the replicas")
	f.StringVar(&metricsAddress, "metrics-address", ":9403", "address to serve /healthz and /metrics on (empty: none)")
	logs.addFlags(f)
	return cmd
}

// runLeaderElected runs run while this process leads, and returns when ctx is done or the
// lead is lost (the Deployment restarts the container, which then campaigns again).
func runLeaderElected(ctx context.Context, client kubernetes.Interface, namespace string, watchdog *leaderelection.HealthzAdaptor, run func(context.Context) error) error {
	host, _ := os.Hostname()
	identity := host + "_" + uuid.NewString()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: LeaderElectionLease},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	var runErr error
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		ReleaseOnCancel: true,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		Name:            LeaderElectionLease,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				runErr = run(ctx)
				cancel()
			},
			OnStoppedLeading: func() { cancel() },
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	if runErr != nil {
		return runErr
	}
	if parent.Err() == nil {
		return fmt.Errorf("lost the lead (Lease %s/%s)", namespace, LeaderElectionLease)
	}
	return nil
}

// breakerControllerMetrics are what the breaker controller exports.
type breakerControllerMetrics struct {
	registry     *prometheus.Registry
	gpus, leader prometheus.Gauge
}

func newBreakerControllerMetrics() *breakerControllerMetrics {
	m := &breakerControllerMetrics{
		registry: prometheus.NewRegistry(),
		gpus: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_breaker_cluster_gpus",
			Help: "The cluster's GPUs as last written to the circuit breaker's ConfigMap (0: not counted yet)."}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "gpuhealth_breaker_leader",
			Help: "1 while this replica leads and counts, else 0."}),
	}
	m.registry.MustRegister(m.gpus, m.leader, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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
		return badInput(fmt.Errorf("--metrics-address: %w", err))
	}
	return httpserve.Serve(ctx, lis, mux)
}
