package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
)

func newHistoryCommand() *cobra.Command {
	var kubeconfig, output string
	cmd := &cobra.Command{
		Use:   "history SERIAL | history NODE GPU",
		Short: "A GPU's life across nodes: where it was, its faults, repairs, validations and drains",
		Long: `history prints the GPURecord of one physical GPU, named by its board serial or by the node and
index it is in now (the serial is then read from the node's report): every node it was seen in,
and the newest events of its life (faults, resets, reboots, clears, validations, drains,
escalations to ReplaceGPU) with lifetime counts. The breaker controller keeps the records from
the agents' reports, by serial, so a record outlives the node's deletion, its re-imaging and the
card's move to another node. A GPU that never had anything to remember has no record.
-o json or -o yaml prints the record itself.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" && output != "yaml" {
				return cmdutil.BadInput(fmt.Errorf("-o: must be table, json or yaml, got %q", output))
			}
			cfg, err := userConfig(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			serial, err := historySerial(cmd.Context(), cfg, args)
			if err != nil {
				return err
			}
			records, err := kube.NewGPURecords(cfg)
			if err != nil {
				return err
			}
			rec, err := records.Get(cmd.Context(), gpurecord.NameFor(serial), metav1.GetOptions{})
			if apierrors.IsNotFound(err) || err == nil && rec.Serial != serial {
				fmt.Fprintf(cmd.OutOrStdout(), "GPU %s has no record: nothing happened to it that the breaker controller saw (is the GPURecord CRD installed and `gpuhealth breaker controller` running?)\n", serial)
				return nil
			}
			if err != nil {
				return fmt.Errorf("reading the record of GPU %s: %w", serial, err)
			}
			return writeRecord(cmd.OutOrStdout(), rec, output)
		},
	}
	addUserKubeconfig(cmd, &kubeconfig)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table, json or yaml")
	return cmd
}

// historySerial is the serial args name: SERIAL, or NODE GPU read from the node's report.
func historySerial(ctx context.Context, cfg *rest.Config, args []string) (string, error) {
	if len(args) == 1 {
		if err := gpurecord.ValidateSerial(args[0]); err != nil {
			return "", cmdutil.BadInput(fmt.Errorf("SERIAL: %w", err))
		}
		return args[0], nil
	}
	node, gpu := args[0], args[1]
	index, err := strconv.Atoi(gpu)
	if err != nil || index < 0 {
		return "", cmdutil.BadInput(fmt.Errorf("GPU: want an index, got %q", gpu))
	}
	client, err := clientFor(cfg)
	if err != nil {
		return "", err
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", cmdutil.BadInput(fmt.Errorf("node %q not found (a deleted node's GPUs are found by serial: gpuhealth history SERIAL)", node))
	}
	if err != nil {
		return "", err
	}
	summaries, err := gpuhealthv1.ParseHealth(n.Annotations[gpuhealthv1.HealthKey])
	if err != nil {
		return "", fmt.Errorf("node %s: %w", node, err)
	}
	for _, s := range summaries {
		if s.Index == index && s.ParentUUID == "" && !s.Missing {
			if s.Serial == "" {
				return "", fmt.Errorf("GPU %d of node %s reports no serial (its driver has none for it, or its agent predates serials)", index, node)
			}
			return s.Serial, nil
		}
	}
	return "", cmdutil.BadInput(fmt.Errorf("node %s reports no GPU %d", node, index))
}

// writeRecord prints rec in format output.
func writeRecord(w io.Writer, rec *gpurecord.GPURecord, output string) error {
	rec.ManagedFields = nil
	rec.APIVersion, rec.Kind = gpurecord.SchemeGroupVersion.String(), gpurecord.Kind
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rec)
	case "yaml":
		b, err := yaml.Marshal(rec)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	fmt.Fprintf(w, "GPU %s (%s): %s\n\n", rec.Serial, cmp.Or(rec.Model, "model unknown"), lifetimeOf(rec))
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NODE\tINDEX\tUUID\tFIRST SEEN\tLAST SEEN")
	for _, p := range rec.Placements {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", p.Node, p.Index, p.UUID, stamp(p.FirstSeen.Time), stamp(p.LastSeen.Time))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TIME\tNODE\tINDEX\tEVENT\tREASON\tBY")
	for _, e := range rec.Events {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", stamp(e.Time.Time), e.Node, e.Index, e.Kind, cmp.Or(e.Reason, "-"), cmp.Or(e.By, "-"))
	}
	if len(rec.Events) == 0 {
		fmt.Fprintln(tw, "(no events kept)")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if dropped := total(rec) - len(rec.Events); dropped > 0 {
		fmt.Fprintf(w, "\n%d older events are counted but no longer kept (a record keeps the newest %d).\n", dropped, gpurecord.MaxEvents)
	}
	return nil
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func total(rec *gpurecord.GPURecord) int {
	n := 0
	for _, c := range rec.Counts {
		n += c
	}
	return n
}

// lifetimeOf sums a record up in one line: its counts by kind and the nodes it was in.
func lifetimeOf(rec *gpurecord.GPURecord) string {
	kinds := []gpurecord.EventKind{gpurecord.EventFault, gpurecord.EventReset, gpurecord.EventReboot, gpurecord.EventValidation,
		gpurecord.EventDrain, gpurecord.EventReplaceGPU, gpurecord.EventCleared}
	var parts []string
	for _, k := range kinds {
		if n := rec.Counts[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	nodes := len(rec.Placements)
	parts = append(parts, fmt.Sprintf("%d node%s", nodes, map[bool]string{true: "s"}[nodes != 1]))
	return strings.Join(parts, ", ")
}

// readLifetimes lists every GPURecord (in pages) and returns each one's lifetime by serial, for
// `gpuhealth status -o wide`.
func readLifetimes(ctx context.Context, records kube.GPURecordInterface) (map[string]string, error) {
	items, err := listAll(ctx, func(ctx context.Context, o metav1.ListOptions) ([]gpurecord.GPURecord, string, error) {
		list, err := records.List(ctx, o)
		if err != nil {
			return nil, "", err
		}
		return list.Items, list.Continue, nil
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(items))
	for i := range items {
		out[items[i].Serial] = lifetimeOf(&items[i])
	}
	return out, nil
}

// addLifetimes sets each GPU's lifetime from the records; GPUs without a record have none.
func addLifetimes(gpus []GPUStatus, lifetimes map[string]string) {
	for i := range gpus {
		if s := gpus[i].Serial; s != "" {
			gpus[i].Lifetime = lifetimes[s]
		}
	}
}

// addRecordLifetimes sets the GPUs' lifetimes from their records; a cluster whose records cannot
// be read (no CRD, no permission) shows none, and says why once.
func addRecordLifetimes(ctx context.Context, cfg *rest.Config, gpus []GPUStatus) {
	logger := klog.FromContext(ctx)
	records, err := kube.NewGPURecords(cfg)
	if err != nil {
		logger.Info("Not showing the GPUs' lifetimes", "err", err)
		return
	}
	lifetimes, err := readLifetimes(ctx, records)
	if err != nil {
		logger.Info("Not showing the GPUs' lifetimes: their records cannot be read", "err", err)
		return
	}
	addLifetimes(gpus, lifetimes)
}
