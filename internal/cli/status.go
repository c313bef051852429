package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/heartbeat"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// GPUStatus is one row of `gpuhealth status`. Its JSON form is a contract:
// {"gpus": [{"node", "index", "uuid", "model", "health", "reasons", "since", "drained", ...}]}.
type GPUStatus struct {
	Node        string     `json:"node"`
	Index       int        `json:"index"`
	UUID        string     `json:"uuid"`
	Model       string     `json:"model"`
	Health      string     `json:"health"`
	Reasons     []string   `json:"reasons"`
	Since       *time.Time `json:"since"`
	Drained     bool       `json:"drained"`
	DrainReason string     `json:"drainReason,omitempty"`
	DrainedBy   string     `json:"drainedBy,omitempty"`
	DrainedAt   *time.Time `json:"drainedAt,omitempty"`
	PCIBusID    string     `json:"pciBusID,omitempty"`
	Evict       bool       `json:"evict,omitempty"`
	ParentUUID  string     `json:"parentUUID,omitempty"`
	// History sums up the GPU's faults and repairs (across restarts and reboots).
	History *gpuhealthv1.HistorySummary `json:"history,omitempty"`
	// Validation is how the GPU's last return to service after a repair was judged: an active
	// test passed or failed, or passive (nothing tested it).
	Validation *gpuhealthv1.ValidationSummary `json:"validation,omitempty"`
	// ExternalTaints are taints other writers put on the GPU's DRA devices (the driver's own, other
	// DeviceTaintRules); each key also shows in Reasons as "external:<key>".
	ExternalTaints []ExternalTaint `json:"externalTaints,omitempty"`
	// Remediation is where the GPU's automatic repair stands (absent: none under way).
	Remediation *gpuhealthv1.GPURemediation `json:"remediation,omitempty"`
	// Evictions are the GPU's pods whose eviction is pending or only reported (dry run,
	// report-only, blocked by a PodDisruptionBudget, held by the circuit breaker).
	Evictions *gpuhealthv1.GPUEvictions `json:"evictions,omitempty"`
	// Heartbeat is when the node's agent last confirmed its report (absent: it does not send
	// heartbeats). Stale: older than --stale-after (or unreadable); Health is then "Unknown" and
	// ReportedHealth what the stopped agent last said.
	Heartbeat *time.Time `json:"heartbeat,omitempty"`
	Stale     bool       `json:"stale,omitempty"`
	// FutureHeartbeat: the heartbeat is further ahead of this clock than --stale-after, which
	// makes it stale too (a node clock far ahead, or a value written by hand).
	FutureHeartbeat bool   `json:"futureHeartbeat,omitempty"`
	ReportedHealth  string `json:"reportedHealth,omitempty"`
	// Serial is the GPU's board serial; Lifetime sums up its GPURecord (its life on every node:
	// `gpuhealth history`), read by -o wide and json only.
	Serial   string `json:"serial,omitempty"`
	Lifetime string `json:"lifetime,omitempty"`
	// WorkloadSignature names the workload whose signature the GPU's recent fault is, in the
	// breaker controller's verdict (fleet.sharedCauses): the workload's doing, not the card's.
	// Its reasons then end in "signature:<workload>".
	WorkloadSignature string `json:"workloadSignature,omitempty"`
}

// HealthUnknown is a row's health when the node's report is stale.
const HealthUnknown = "Unknown"

func newStatusCommand() *cobra.Command {
	var kubeconfig, node, output, driver, agentNamespace string
	var problems bool
	var staleAfter time.Duration
	cmd := &cobra.Command{
		Use:   "status [--node NODE] [-o table|wide|json]",
		Short: "Show the health of every GPU in the cluster",
		Long: `status reads what the gpuhealth agents report on the Nodes (and the administrative drains) and
prints one row per GPU: node, index, UUID, model, health, reasons, since when, and whether an
administrator drained it. Taints that other writers put on a GPU's DRA devices (the DRA
driver's own taints in its ResourceSlices, DeviceTaintRules that are not gpuhealth's) show as
reasons "external:<key>": they keep the device out of scheduling whatever gpuhealth says. A GPU
whose recent fault the breaker controller found to be a workload's signature (fleet.sharedCauses:
the same fault on many of one job's GPUs at once) has the reason "signature:<workload>".
A node whose agent's heartbeat (its Lease in --agent-namespace; for an agent of an earlier release
the annotation gpuhealth.dev/gpu-health-heartbeat) is older than --stale-after shows its GPUs as
"Unknown (stale since ...)": its agent stopped, and its last word proves nothing. Nodes and
Leases are read in pages of 500, so a 50,000-node cluster costs no single huge response.
-o wide adds MIG instances, PCI bus IDs, drain details and each GPU's lifetime across nodes (its
GPURecord: gpuhealth history); -o json prints {"gpus": [...]}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "wide" && output != "json" {
				return cmdutil.BadInput(fmt.Errorf("-o: must be table, wide or json, got %q", output))
			}
			cfg, err := userConfig(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			client, err := clientFor(cfg)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			ctx := cmd.Context()
			var nodes []corev1.Node
			if node != "" {
				n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return cmdutil.BadInput(fmt.Errorf("node %q not found", node))
				}
				if err != nil {
					return err
				}
				nodes = []corev1.Node{*n}
			} else {
				if nodes, err = listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]corev1.Node, string, error) {
					list, err := client.CoreV1().Nodes().List(ctx, o)
					if err != nil {
						return nil, "", err
					}
					return list.Items, list.Continue, nil
				}); err != nil {
					return err
				}
			}
			logger := klog.FromContext(ctx)
			leases, err := heartbeatLeases(ctx, client, agentNamespace)
			if err != nil {
				logger.Info("Judging heartbeats by the Nodes' annotations only: the agents' heartbeat Leases cannot be read", "namespace", agentNamespace, "err", err)
			}
			gpus := collectStatusWith(nodes, leases, logger, time.Now(), staleAfter)
			if view, err := readDRAView(ctx, client, driver); err != nil {
				logger.Info("Not showing other writers' DRA taints", "err", err)
			} else {
				view.addExternalTaints(gpus, logger)
			}
			if output != "table" {
				addRecordLifetimes(ctx, cfg, gpus)
			}
			addWorkloadSignatures(ctx, client, agentNamespace, gpus)
			if problems {
				gpus = slices.DeleteFunc(gpus, func(g GPUStatus) bool {
					return g.Health == health.Healthy.String() && !g.Drained && len(g.ExternalTaints) == 0 && !g.Stale
				})
			}
			switch output {
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					GPUs []GPUStatus `json:"gpus"`
				}{gpus})
			default:
				return writeStatusTable(cmd.OutOrStdout(), gpus, output == "wide", time.Now())
			}
		},
	}
	addUserKubeconfig(cmd, &kubeconfig)
	cmd.Flags().StringVar(&node, "node", "", "only this node")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, wide or json")
	cmd.Flags().BoolVar(&problems, "problems", false, "only GPUs that are not Healthy, are drained or carry other writers' taints")
	cmd.Flags().StringVar(&driver, "driver-name", config.DefaultDriverName, "the DRA driver whose devices carry the GPUs")
	cmd.Flags().DurationVar(&staleAfter, "stale-after", gpuhealthv1.DefaultStaleAfter, "a node whose agent's heartbeat is older shows its GPUs as Unknown (0: trust every report)")
	cmd.Flags().StringVar(&agentNamespace, "agent-namespace", config.DefaultBreakerNamespace, "namespace of the agents' heartbeat Leases (the chart's release namespace)")
	return cmd
}

// statusPage is how many objects one list of `gpuhealth status` asks for.
const statusPage = 500

// listAll lists every object of a paged list, statusPage at a time.
func listAll[T any](ctx context.Context, list func(context.Context, metav1.ListOptions) ([]T, string, error)) ([]T, error) {
	var all []T
	opts := metav1.ListOptions{Limit: statusPage}
	for {
		items, next, err := list(ctx, opts)
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		opts.Continue = next
	}
}

// heartbeatLeases returns the agents' heartbeat Leases in namespace by the node each names.
func heartbeatLeases(ctx context.Context, client kubernetes.Interface, namespace string) (map[string]*coordinationv1.Lease, error) {
	items, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]coordinationv1.Lease, string, error) {
		o.LabelSelector = gpuhealthv1.HeartbeatLeaseLabel + "=true"
		list, err := client.CoordinationV1().Leases(namespace).List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*coordinationv1.Lease, len(items))
	for i := range items {
		if h := items[i].Spec.HolderIdentity; h != nil && items[i].Name == gpuhealthv1.HeartbeatLeaseName(*h) {
			out[*h] = &items[i]
		}
	}
	return out, nil
}

// collectStatus builds the rows from the Nodes' annotations, judging their heartbeats at now
// against staleAfter. A node whose annotations cannot be read is reported in the log and skipped;
// the others still count.
func collectStatus(nodes []corev1.Node, logger klog.Logger, now time.Time, staleAfter time.Duration) []GPUStatus {
	return collectStatusWith(nodes, nil, logger, now, staleAfter)
}

// collectStatusWith is collectStatus with the agents' heartbeat Leases by node: a node with one
// is judged by it, the others by their heartbeat annotation.
func collectStatusWith(nodes []corev1.Node, leases map[string]*coordinationv1.Lease, logger klog.Logger, now time.Time, staleAfter time.Duration) []GPUStatus {
	gpus := []GPUStatus{}
	for _, n := range nodes {
		first := len(gpus)
		summaries, err := gpuhealthv1.ParseHealth(n.Annotations[gpuhealthv1.HealthKey])
		if err != nil {
			logger.Error(err, "Skipping a node with a malformed health annotation", "node", n.Name)
			continue
		}
		drains, err := gpuhealthv1.ParseDrains(n.Annotations[gpuhealthv1.DrainsKey])
		if err != nil {
			logger.Error(err, "Ignoring a malformed drains annotation", "node", n.Name)
			drains = map[string]gpuhealthv1.Drain{}
		}
		repairs, err := gpuhealthv1.ParseRemediation(n.Annotations[gpuhealthv1.RemediationKey])
		if err != nil {
			logger.Error(err, "Ignoring a malformed remediation annotation", "node", n.Name)
		}
		evictions, err := gpuhealthv1.ParseEvictions(n.Annotations[gpuhealthv1.EvictionsKey])
		if err != nil {
			logger.Error(err, "Ignoring a malformed evictions annotation", "node", n.Name)
		}
		for uuid, s := range summaries {
			row := GPUStatus{Node: n.Name, Index: s.Index, UUID: uuid, Model: s.Model, Health: s.Health,
				Reasons: s.Reasons, Since: s.Since, PCIBusID: s.PCIBusID, Evict: s.Evict, ParentUUID: s.ParentUUID, History: s.History, Validation: s.Validation, Serial: s.Serial}
			if d, ok := drains[uuid]; ok {
				markDrained(&row, d)
			}
			if r, ok := repairs[uuid]; ok {
				row.Remediation = &r
			}
			if e, ok := evictions[uuid]; ok {
				row.Evictions = &e
			}
			gpus = append(gpus, row)
		}
		// A drain the agent has not reported yet (or for a GPU it no longer sees) still shows.
		for uuid, d := range drains {
			if _, ok := summaries[uuid]; !ok {
				row := GPUStatus{Node: n.Name, Index: d.Index, UUID: uuid, Health: HealthUnknown}
				markDrained(&row, d)
				gpus = append(gpus, row)
			}
		}
		markStale(gpus[first:], heartbeat.Judge(n.Name, n.Annotations, leases[n.Name], now, staleAfter))
	}
	slices.SortFunc(gpus, func(a, b GPUStatus) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Index, b.Index),
			cmp.Compare(a.ParentUUID, b.ParentUUID), cmp.Compare(a.UUID, b.UUID))
	})
	return gpus
}

// markStale gives a node's rows its heartbeat, and makes them Unknown when it is stale.
func markStale(rows []GPUStatus, s gpuhealthv1.Staleness) {
	for i := range rows {
		r := &rows[i]
		if !s.Heartbeat.IsZero() {
			at := s.Heartbeat
			r.Heartbeat = &at
		}
		if s.Stale {
			r.Stale, r.ReportedHealth, r.Health, r.FutureHeartbeat = true, r.Health, HealthUnknown, s.Future
		}
	}
}

func markDrained(row *GPUStatus, d gpuhealthv1.Drain) {
	row.Drained, row.DrainReason, row.DrainedBy = true, d.Reason, d.By
	if !d.At.IsZero() {
		at := d.At
		row.DrainedAt = &at
	}
	if row.Health != health.Unhealthy.String() {
		row.Health = health.Unhealthy.String()
		row.Since = row.DrainedAt
	}
	if !slices.Contains(row.Reasons, health.ReasonAdminDrain) {
		row.Reasons = append([]string{health.ReasonAdminDrain}, row.Reasons...)
	}
}

func writeStatusTable(w io.Writer, gpus []GPUStatus, wide bool, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	header := "NODE\tINDEX\tUUID\tMODEL\tHEALTH\tREASONS\tSINCE\tDRAINED\tREMEDIATION"
	if wide {
		header += "\tPCI BUS ID\tEVICT\tDRAINED BY\tDRAIN REASON\tHISTORY\tLIFETIME\tEVICTIONS"
	}
	fmt.Fprintln(tw, header)
	for _, g := range gpus {
		if g.ParentUUID != "" && !wide {
			continue
		}
		index := fmt.Sprint(g.Index)
		if g.Index < 0 {
			index = "?"
		}
		if g.ParentUUID != "" {
			index += "/mig"
		}
		reasons, since := "<none>", "<none>"
		if len(g.Reasons) > 0 {
			reasons = strings.Join(g.Reasons, ",")
		}
		if g.Since != nil {
			since = duration.HumanDuration(now.Sub(*g.Since))
		}
		model := cmp.Or(g.Model, "<unknown>")
		repair := "-"
		if g.Remediation != nil {
			repair = g.Remediation.Short()
		}
		healthText := g.Health
		if g.Stale {
			healthText = HealthUnknown + " (stale: no heartbeat)"
			switch {
			case g.Heartbeat != nil && g.FutureHeartbeat:
				healthText = fmt.Sprintf("%s (heartbeat in the future: %s, was %s)", HealthUnknown, g.Heartbeat.UTC().Format(time.RFC3339), g.ReportedHealth)
			case g.Heartbeat != nil:
				healthText = fmt.Sprintf("%s (stale since %s, was %s)", HealthUnknown, g.Heartbeat.UTC().Format(time.RFC3339), g.ReportedHealth)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%t\t%s", g.Node, index, g.UUID, model, healthText, reasons, since, g.Drained, repair)
		if wide {
			evictions := "-"
			if g.Evictions != nil {
				evictions = g.Evictions.Short()
			}
			fmt.Fprintf(tw, "\t%s\t%t\t%s\t%s\t%s\t%s\t%s", cmp.Or(g.PCIBusID, "<none>"), g.Evict, cmp.Or(g.DrainedBy, "<none>"), cmp.Or(g.DrainReason, "<none>"), g.History, cmp.Or(g.Lifetime, "-"), evictions)
		}
		fmt.Fprintln(tw)
	}
	if len(gpus) == 0 {
		fmt.Fprintln(tw, "No GPUs to show.")
	}
	return tw.Flush()
}

// newUserClient builds a client for an operator: an explicit kubeconfig, else the usual
// kubeconfig search ($KUBECONFIG, ~/.kube/config), else the in-cluster configuration.
func newUserClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := userConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return clientFor(cfg)
}

// clientFor is a client of the API server cfg names.
func clientFor(cfg *rest.Config) (kubernetes.Interface, error) { return kubernetes.NewForConfig(cfg) }

// userConfig is the connection newUserClient makes.
func userConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		if kubeconfig != "" || !clientcmd.IsEmptyConfig(err) {
			return nil, fmt.Errorf("kubeconfig: %w", err)
		}
		if cfg, err = rest.InClusterConfig(); err != nil {
			return nil, errors.New("no kubeconfig found: pass --kubeconfig or set KUBECONFIG")
		}
	}
	cfg.UserAgent = "gpuhealth"
	return cfg, nil
}
