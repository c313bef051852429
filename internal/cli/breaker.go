package cli

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gpuhealth/gpuhealth/internal/report/breaker"
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
		kubeconfig, namespace string
		leaderElect           bool
		logs                  logOptions
	)
	cmd := &cobra.Command{
		Use:   "controller [--kubeconfig FILE] [--namespace NS] [--leader-elect]",
		Short: "Keep the cluster's GPU count in the circuit breaker's ConfigMap (a Deployment; the chart runs it)",
		Long: `controller watches the Nodes' metadata once for the whole cluster, counts the physical GPUs the
agents report in their gpuhealth.dev/gpu-health annotations, and writes the count into the
ConfigMap gpuhealth-circuit-breaker, from which every agent computes the breaker's budget. With
--leader-elect (default) its replicas elect one leader through the Lease ` + LeaderElectionLease + `.`,
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
			counter := &breaker.Counter{Client: client, Metadata: meta, Namespace: namespace}
			if !leaderElect {
				return counter.Run(ctx)
			}
			return runLeaderElected(ctx, client, namespace, counter.Run)
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVarP(&namespace, "namespace", "n", cmp.Or(os.Getenv("POD_NAMESPACE"), config.DefaultBreakerNamespace), "namespace of the circuit breaker's ConfigMap and slots")
	f.BoolVar(&leaderElect, "leader-elect", true, "elect one leader among the replicas")
	logs.addFlags(f)
	return cmd
}

// runLeaderElected runs run while this process leads, and returns when ctx is done or the
// lead is lost (the Deployment restarts the container, which then campaigns again).
func runLeaderElected(ctx context.Context, client kubernetes.Interface, namespace string, run func(context.Context) error) error {
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
