package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/fleet/sharedcause"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func newFleetCommand() *cobra.Command {
	var (
		kubeconfig, output, driver string
		labels                     []string
		opts                       sharedcause.Options
	)
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "What the cluster's recent GPU faults have in common: a driver, a model, an NVLink domain, a zone, a rack, a job",
		Long: `Reads every node's GPU health report and the GPU-sharing pods, and groups the GPUs that had a
fault within --window by what they share: the driver version (GPU feature discovery's labels),
the GPU model, the NVLink domain (nvidia.com/gpu.clique), the zone, and each --label. A group whose
share of faulty GPUs is far above the rest of the fleet's (at least --min-faulty-gpus on two nodes,
--min-ratio times the rest's rate, and Fisher's exact test, one-sided, below --alpha over the groups
tested) is a shared cause. Faults of one reason on many GPUs of one job within seconds are that
job's signature and count as no GPU's fault. A job holds the GPUs its pods name (GPU sharing) or
hold through ResourceClaims allocated by --driver-name (the driver's ResourceSlices say which GPU
each device is).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return cmdutil.BadInput(fmt.Errorf("--output %q: want table or json", output))
			}
			if opts.Window > 0 && opts.Window < sharedcause.DefaultSignatureWindow {
				opts.SignatureWindow = opts.Window // a burst is judged within the faults judged
			}
			opts = opts.WithDefaults()
			if err := opts.Validate(); err != nil {
				return cmdutil.BadInput(flagError(err))
			}
			client, err := newUserClient(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			j, err := judgeFleet(cmd.Context(), client, labels, driver, opts, time.Now())
			if err != nil {
				return err
			}
			logger := klog.FromContext(cmd.Context())
			for _, s := range j.collected.Skipped {
				logger.Info("Warning: a node's GPU health report cannot be read; its GPUs are left out", "node", s)
			}
			if j.podsErr != nil {
				logger.Info("Warning: judging without workloads: a job's signature counts as its GPUs' faults", "err", j.podsErr)
			} else if j.claimsErr != nil {
				logger.Info("Warning: judging without the GPUs pods hold through ResourceClaims: such a job's signature counts as its GPUs' faults", "err", j.claimsErr)
			}
			if output == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(j.result)
			}
			return writeFleetTable(cmd.OutOrStdout(), j)
		},
	}
	addUserKubeconfig(cmd, &kubeconfig)
	f := cmd.Flags()
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringVar(&driver, "driver-name", config.DefaultDriverName, "the DRA driver whose ResourceClaims' devices are GPUs")
	f.StringArrayVar(&labels, "label", nil, "a node label to group by as well (a rack, a switch, a node pool); repeatable")
	f.DurationVar(&opts.Window, "window", 0, "the faults judged: those of the last window (0: 1h)")
	f.IntVar(&opts.MinFaultyGPUs, "min-faulty-gpus", 0, "the fewest faulty GPUs a group needs to be a finding (0: 5)")
	f.Float64Var(&opts.MinRatio, "min-ratio", 0, "how many times the rest's rate a group's rate must be (0: 5)")
	f.Float64Var(&opts.Alpha, "alpha", 0, "the chance of a false finding allowed over every group tested (0: 0.001)")
	return cmd
}

// fleetJudgement is one judgement of the cluster and what it was judged from.
type fleetJudgement struct {
	result    sharedcause.Result
	collected fleet.Collected
	// podsErr is why the pods could not be listed (they may not: the judgement has no workloads).
	podsErr error
	// claimsErr is why the ResourceClaims or the driver's ResourceSlices could not be listed: the
	// pods that hold GPUs through claims give their workloads none.
	claimsErr error
}

// judgeFleet lists the Nodes, the running pods, the ResourceClaims and driver's ResourceSlices
// (all paged) and judges them at now. A user who may not list pods gets a judgement without
// workloads (podsErr says so), one who may not list claims or slices one without the GPUs pods
// hold through claims (claimsErr); any other error ends it.
func judgeFleet(ctx context.Context, client kubernetes.Interface, labels []string, driver string, opts sharedcause.Options, now time.Time) (fleetJudgement, error) {
	var j fleetJudgement
	nodes, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]corev1.Node, string, error) {
		list, err := client.CoreV1().Nodes().List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	if err != nil {
		return j, err
	}
	pods, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]corev1.Pod, string, error) {
		o.FieldSelector = "status.phase=Running"
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	switch {
	case apierrors.IsForbidden(err):
		j.podsErr = err
	case err != nil:
		return j, err
	}
	var held map[string][]string
	if j.podsErr == nil {
		held, err = listClaimCards(ctx, client, pods, driver)
		switch {
		case apierrors.IsForbidden(err):
			j.claimsErr = err
		case err != nil:
			return j, err
		}
	}
	j.collected = fleet.CollectHeld(nodes, pods, held, labels)
	j.result, err = sharedcause.Judge(now, j.collected.Fleet, opts)
	return j, err
}

// listClaimCards lists the ResourceClaims and driver's ResourceSlices and returns the GPUs each
// of pods holds through claims (fleet.ClaimCards). No pod uses a claim: nothing is listed.
func listClaimCards(ctx context.Context, client kubernetes.Interface, pods []corev1.Pod, driver string) (map[string][]string, error) {
	uses := false
	for i := range pods {
		if uses = len(dra.PodClaimNames(&pods[i])) > 0; uses {
			break
		}
	}
	if !uses {
		return nil, nil
	}
	claims, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]resourceapi.ResourceClaim, string, error) {
		list, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	if err != nil {
		return nil, err
	}
	rslices, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]resourceapi.ResourceSlice, string, error) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.driver", driver).String()
		list, err := client.ResourceV1().ResourceSlices().List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	if err != nil {
		return nil, err
	}
	return fleet.ClaimCards(pods, claims, rslices, driver, dra.DefaultAttributes()), nil
}

// flagError names the flag of an option's error ("minRatio: ..." → "--min-ratio: ...").
func flagError(err error) error {
	msg := err.Error()
	for option, flag := range map[string]string{"window": "--window", "minFaultyGPUs": "--min-faulty-gpus", "minRatio": "--min-ratio", "alpha": "--alpha"} {
		if rest, ok := strings.CutPrefix(msg, option+":"); ok {
			return errors.New(flag + ":" + rest)
		}
	}
	return err
}

// writeFleetTable prints a judgement: the fleet's rate, the shared causes, the signatures.
func writeFleetTable(w io.Writer, j fleetJudgement) error {
	res := j.result
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "fleet: %d GPUs, %d with a fault in the last %s (%s); %d groups tested\n",
		res.GPUs, res.FaultyGPUs, duration.HumanDuration(res.Window), percent(res.FleetRate), res.GroupsTested)
	if j.podsErr != nil {
		fmt.Fprintln(tw, "workloads: unknown (you may not list pods): a job's signature counts as its GPUs' faults")
	} else if j.claimsErr != nil {
		fmt.Fprintln(tw, "workloads: without ResourceClaims (you may not list them or the driver's ResourceSlices): such a job's signature counts as its GPUs' faults")
	}
	if len(res.SharedCauses) == 0 {
		fmt.Fprintln(tw, "no shared cause")
	} else {
		fmt.Fprintln(tw, "\nSHARED\tVALUE\tFAULTY GPUS\tNODES\tRATE\tREST\tRATIO\tSINCE\tREASONS")
		for _, f := range res.SharedCauses {
			fmt.Fprintf(tw, "%s\t%s\t%d of %d\t%d of %d\t%s\t%s\t%.1f×\t%s\t%s\n", f.Attribute, f.Value,
				f.FaultyGPUs, f.GPUs, f.FaultyNodes, f.Nodes, percent(f.Rate), percent(f.RestRate), f.Ratio,
				duration.HumanDuration(res.Now.Sub(f.Since)), reasons(f.Reasons))
		}
	}
	if len(res.Signatures) > 0 {
		fmt.Fprintln(tw, "\nWORKLOAD\tREASON\tGPUS\tFAULTS\tFIRST\tSPAN")
		for _, s := range res.Signatures {
			fmt.Fprintf(tw, "%s\t%s\t%d of %d\t%d\t%s\t%s\n", s.Workload, s.Reason, len(s.GPUs), s.WorkloadGPUs, s.Faults,
				duration.HumanDuration(res.Now.Sub(s.First)), s.Last.Sub(s.First).Round(time.Millisecond))
		}
	}
	return tw.Flush()
}

func percent(r float64) string { return fmt.Sprintf("%.2f%%", 100*r) }

func reasons(rs []sharedcause.ReasonCount) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%s (%d)", r.Reason, r.Faults)
	}
	return strings.Join(parts, ", ")
}
