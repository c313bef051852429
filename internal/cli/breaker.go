package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuhealth/gpuhealth/internal/report/breaker"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

func newBreakerCommand() *cobra.Command {
	var kubeconfig, namespace string
	cmd := &cobra.Command{
		Use:   "breaker ack|status",
		Short: "Inspect or acknowledge the circuit breaker that holds back disruptive taints in a mass failure",
		Long: `When more than the configured share of the cluster's GPUs would turn NoSchedule or NoExecute
within the window (agent.circuitBreaker in the HealthConfig), the agents taint further GPUs None
instead and say so (Event CircuitBreakerOpen, Node condition GPUCircuitBreakerOpen, metric
gpuhealth_circuit_breaker_held_gpus). "breaker status" lists the GPUs admitted in the current
window; "breaker ack" tells the agents the wave is understood: admissions so far stop counting,
and held GPUs get their effects.`,
	}
	status := &cobra.Command{
		Use:   "status",
		Short: "List the GPUs admitted to NoSchedule/NoExecute in the shared budget",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := newUserClient(kubeconfig)
			if err != nil {
				return badInput(err)
			}
			cm, err := client.CoreV1().ConfigMaps(namespace).Get(cmd.Context(), breaker.ConfigMapName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				_, err = fmt.Fprintln(cmd.OutOrStdout(), "No GPU admitted yet: the circuit breaker has not been used.")
				return err
			}
			if err != nil {
				return err
			}
			var entries []breaker.Entry
			if err := json.Unmarshal([]byte(cm.Data[breaker.AdmittedKey]), &entries); err != nil && cm.Data[breaker.AdmittedKey] != "" {
				return fmt.Errorf("configmap %s/%s: %s: %w", namespace, breaker.ConfigMapName, breaker.AdmittedKey, err)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "acknowledged at: %s\n", cmpOrNone(cm.Data[breaker.AcknowledgedAtKey]))
			tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "NODE\tGPU\tADMITTED")
			for _, e := range entries {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", e.Node, e.UUID, e.At.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
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
		c.Flags().StringVarP(&namespace, "namespace", "n", config.DefaultBreakerNamespace, "namespace of the agents' circuit breaker ConfigMap")
	}
	cmd.AddCommand(status, ack)
	return cmd
}

func cmpOrNone(s string) string {
	if s == "" {
		return "<never>"
	}
	return s
}
