package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	breakercontroller "github.com/gpuhealth/gpuhealth/internal/breaker/controller"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/fleet/watch"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/kube/adapt"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

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
		addUserKubeconfig(c, &kubeconfig)
		c.Flags().StringVarP(&namespace, "namespace", "n", config.DefaultBreakerNamespace, "namespace of the agents' circuit breaker")
	}
	cmd.AddCommand(status, ack, newBreakerControllerCommand())
	return cmd
}

func breakerStatus(ctx context.Context, client kubernetes.Interface, namespace string, window time.Duration, out io.Writer) error {
	var total int
	var acknowledged time.Time
	cm, err := client.CoreV1().ConfigMaps(namespace).Get(ctx, breaker.ConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = nil
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
	if err := tw.Flush(); err != nil {
		return err
	}
	if cm == nil {
		return nil
	}
	return breakerDomainStatus(ctx, client, namespace, cm, cutoff, out)
}

// breakerDomainStatus prints the budgets per domain: each value's GPUs, budget and live slots.
func breakerDomainStatus(ctx context.Context, client kubernetes.Interface, namespace string, cm *corev1.ConfigMap, cutoff time.Time, out io.Writer) error {
	fractions := breaker.ParseDomainFractions(cm)
	if len(fractions) == 0 {
		return nil
	}
	var domains []breaker.Domain
	for _, l := range slices.Sorted(maps.Keys(fractions)) {
		domains = append(domains, breaker.Domain{Label: l, MaxFraction: fractions[l]})
	}
	slots, err := client.CoordinationV1().Leases(namespace).List(ctx, metav1.ListOptions{LabelSelector: breaker.DomainSlotLabel})
	if err != nil {
		return err
	}
	live := map[string]int{}
	for _, l := range slots.Items {
		if l.CreationTimestamp.After(cutoff) {
			live[l.Labels[breaker.DomainSlotLabel]]++
		}
	}
	fmt.Fprintln(out)
	if n := cm.Data[breaker.DomainValuesDroppedKey]; n != "" {
		fmt.Fprintf(out, "domain values not counted (past %d): %s; their nodes are under the cluster's budget only\n", breaker.MaxDomainValues, n)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "DOMAIN\tVALUE\tGPUS\tBUDGET\tUSED\tFULL")
	for _, u := range breaker.DomainsInUse(domains, breaker.ParseDomainGPUs(cm), live) {
		full := "no"
		if u.Full() {
			full = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", u.Label, u.Value, u.GPUs, u.Budget, u.Used, full)
	}
	return tw.Flush()
}

// parseBreakerDomains reads --domain LABEL=MAXFRACTION flags, checked as the HealthConfig's
// agent.circuitBreaker.domains are.
func parseBreakerDomains(flags []string) ([]breaker.Domain, error) {
	cb := config.CircuitBreakerConfig{}
	for _, f := range flags {
		label, fraction, ok := strings.Cut(f, "=")
		n, err := strconv.ParseFloat(fraction, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("--domain %q: want LABEL=MAXFRACTION", f)
		}
		cb.Domains = append(cb.Domains, config.BreakerDomain{Label: label, MaxFraction: n})
	}
	if err := cb.ValidateDomains(); err != nil {
		return nil, fmt.Errorf("--domain: %w", err)
	}
	return breakerDomains(cb.Domains), nil
}

// breakerDomains are the configuration's domains as package breaker takes them.
func breakerDomains(in []config.BreakerDomain) []breaker.Domain {
	out := make([]breaker.Domain, 0, len(in))
	for _, d := range in {
		out = append(out, breaker.Domain{Label: d.Label, MaxFraction: d.MaxFraction})
	}
	return out
}

// Client limits of the breaker controller: one metadata watch of the Nodes, one ConfigMap write
// per change of the count, and the leader-election Lease.
const (
	breakerControllerQPS   = 20
	breakerControllerBurst = 40
)

// fleetSettings reads the HealthConfig at path (none when empty) for its fleet section: the
// settings of the continuous judge of shared causes, nil when it is off, and the GPU records'.
// Errors name the file and the field.
func fleetSettings(path string) (*watch.Settings, config.RecordsConfig, error) {
	if path == "" {
		return nil, config.RecordsConfig{}, nil
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, config.RecordsConfig{}, fmt.Errorf("--config: %w", err)
	}
	if sc := cfg.Fleet.SharedCauses; sc.IsEnabled() {
		s := watch.SettingsFrom(sc)
		return &s, cfg.Fleet.Records, nil
	}
	return nil, cfg.Fleet.Records, nil
}

func newBreakerControllerCommand() *cobra.Command {
	var (
		kubeconfig, namespace, metricsAddress, driver string
		configPath                                    string
		capacityResources, domains                    []string
		window, staleAfter                            time.Duration
		leaderElect, agentSilence, silentTaint        bool
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
--agent-silence (default) it marks every node whose agent went silent (heartbeat older than
--stale-after, unreadable, in the future, or removed after it had one): the GPUUnhealthy condition
Unknown with reason AgentSilent, a GPUAgentSilent Event (GPUAgentBack when it writes again), the
metric gpuhealth_agent_silent_nodes, and with --agent-silent-taint the NoSchedule taint
gpuhealth.dev/agent-silent until the agent is back. With
--leader-elect (default) its replicas elect one leader through the Lease ` + breakercontroller.LeaderElectionLease + `.
With --config FILE (the agents' HealthConfig, of which only the fleet section is read) and
fleet.sharedCauses.enabled, it judges every fleet.sharedCauses.every what the fleet's recent GPU
faults share, as "gpuhealth fleet" does (it then lists and watches the running pods), and
publishes the verdict: the ConfigMap gpuhealth-fleet-findings, FleetSharedCause Events, and
gpuhealth_fleet_findings. With fleet.records.enabled it keeps every GPU's life by board serial in
GPURecords (the CRD gpurecords.gpuhealth.dev), from the agents' reports.
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
			sharedCauses, recordsCfg, err := fleetSettings(configPath)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			cfg, err := cmdutil.ComponentConfig(kubeconfig, "gpuhealth-breaker-controller", breakerControllerQPS, breakerControllerBurst)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			budgets, err := parseBreakerDomains(domains)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			var records kube.GPURecordInterface
			if recordsCfg.IsEnabled() {
				if records, err = kube.NewGPURecords(cfg); err != nil {
					return cmdutil.BadInput(err)
				}
			}
			err = breakercontroller.Run(ctx, breakercontroller.Options{
				Client: client, Namespace: namespace, Driver: driver, CapacityResources: capacityResources,
				Window: window, StaleAfter: staleAfter, LeaderElect: leaderElect, MetricsAddress: metricsAddress,
				AgentSilence: agentSilence && staleAfter > 0, SilentTaint: silentTaint, Domains: budgets, SharedCauses: sharedCauses,
				Records: records, MaxRecords: ptr.Deref(recordsCfg.MaxRecords, 0),
				MoreSlots: []breaker.SweptPool{breaker.ExpiringPool(remediation.SlotPool(adapt.Clientset(client), namespace))},
			})
			if errors.Is(err, breakercontroller.ErrListen) {
				return cmdutil.BadInput(fmt.Errorf("--metrics-address: %w", err))
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&configPath, "config", "", "the HealthConfig file (the agents'); only its fleet section is read: fleet.sharedCauses judges what the fleet's GPU faults share, fleet.records keeps GPURecords")
	f.StringVarP(&namespace, "namespace", "n", cmp.Or(os.Getenv("POD_NAMESPACE"), config.DefaultBreakerNamespace), "namespace of the circuit breaker's ConfigMap and slots (and remediation's slots)")
	f.DurationVar(&window, "window", config.DefaultBreakerWindow, "the agents' circuitBreaker.window: a breaker slot older than this is deleted")
	f.StringVar(&driver, "driver", config.DefaultDriverName, "the DRA driver whose ResourceSlices bound each node's GPU count")
	f.DurationVar(&staleAfter, "stale-after", gpuhealthv1.DefaultStaleAfter, "a node whose agent's heartbeat is older (or unreadable) is left out of the count (0: count every node)")
	f.StringSliceVar(&capacityResources, "capacity-resources", breaker.DefaultCapacityResources, "extended resources whose capacity bounds each node's GPU count (a trailing * is a prefix)")
	f.StringArrayVar(&domains, "domain", nil, "a budget per value of a node label, LABEL=MAXFRACTION (agent.circuitBreaker.domains; repeatable): count each value's GPUs and report a full one")
	f.BoolVar(&leaderElect, "leader-elect", true, "elect one leader among the replicas")
	f.BoolVar(&agentSilence, "agent-silence", true, "mark the nodes whose agents went silent (condition GPUUnhealthy Unknown, reason AgentSilent; an Event; a metric); off with --stale-after=0")
	f.BoolVar(&silentTaint, "agent-silent-taint", false, "also taint a silent agent's node "+gpuhealthv1.AgentSilentTaintKey+":NoSchedule until the agent writes again")
	f.StringVar(&metricsAddress, "metrics-address", ":9403", "address to serve /healthz and /metrics on (empty: none)")
	logs.addFlags(f)
	return cmd
}
