package cli

import (
	"fmt"
	"net"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
)

// Client limits of the extender: informers cost one LIST and a WATCH each; the rest is one GET,
// one PATCH and one Binding per bound pod, which must keep up with the scheduler, and with
// --requeue one PATCH per pod to retry after a node recovers (at most 10 a second of these).
const (
	extenderQPS   = 50
	extenderBurst = 100
)

func newExtenderCommand() *cobra.Command {
	var (
		listenAddress, kubeconfig string
		bind, requeue             bool
		maxRequestBytes           int64
		logs                      logOptions
	)
	cmd := &cobra.Command{
		Use:   "extender --listen-address HOST:PORT [--kubeconfig FILE] [--bind] [--requeue]",
		Short: "Serve kube-scheduler's HTTP extender API: keep pods off unhealthy and drained GPUs",
		Long: `extender answers kube-scheduler's extender calls (/filter, /prioritize and, with --bind,
/bind) for clusters that schedule GPUs through the device plugin (nvidia.com/gpu) or Volcano-style
GPU sharing (volcano.sh/gpu-memory). It reads the GPU health the agent writes on each Node:
nodes whose healthy, undrained GPUs cannot hold the pod are filtered out with a reason, nodes
where the pod packs onto cards in use and avoids Degraded ones score higher, and --bind records
the healthy card a GPU-sharing pod gets (volcano.sh/gpu-index, gpuhealth.dev/gpu-uuid) before
binding it. --requeue (on with --bind unless set) annotates the pods it rejected because of GPU
health (gpuhealth.dev/requeued-at) when a node they were rejected on recovers, so that the
scheduler retries them at once. /healthz answers once the node and pod caches are filled; /metrics
serves call latency and errors by verb and the nodes /filter passed or failed. See
docs/extender.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(listenAddress); err != nil {
				return badInput(fmt.Errorf("--listen-address: %w", err))
			}
			if maxRequestBytes <= 0 {
				return badInput(fmt.Errorf("--max-request-bytes: must be positive, got %d", maxRequestBytes))
			}
			client, err := newExtenderClient(kubeconfig)
			if err != nil {
				return badInput(err)
			}
			ln, err := net.Listen("tcp", listenAddress)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("requeue") {
				// --bind comes with patch on pods (the chart's RBAC), which requeueing needs.
				requeue = bind
			}
			return extender.Run(ctx, ln, client, extender.Options{Bind: bind, Requeue: requeue, MaxRequestBytes: maxRequestBytes})
		},
	}
	f := cmd.Flags()
	f.StringVar(&listenAddress, "listen-address", "127.0.0.1:8888", "address to serve the extender API and /healthz on")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.BoolVar(&bind, "bind", false, "serve /bind: bind pods, recording the chosen card of GPU-sharing pods first")
	f.BoolVar(&requeue, "requeue", false, "when a node's GPUs recover, annotate the pending pods rejected there for GPU health so that the scheduler retries them (needs patch on pods; default: the value of --bind)")
	f.Int64Var(&maxRequestBytes, "max-request-bytes", extender.DefaultMaxRequestBytes, "largest request body accepted")
	logs.addFlags(f)
	return cmd
}

func newExtenderClient(kubeconfig string) (kubernetes.Interface, error) {
	return newComponentClient(kubeconfig, "gpuhealth-extender", extenderQPS, extenderBurst)
}
