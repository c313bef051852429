package cli

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/scheduling/extender"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
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
		listenAddress, kubeconfig, agentNamespace string
		bind, requeue                             bool
		maxRequestBytes                           int64
		maxConcurrent                             int
		schedulerNames                            []string
		certFile, keyFile, caFile                 string
		insecure                                  bool
		staleAfter                                time.Duration
		logs                                      logOptions
	)
	cmd := &cobra.Command{
		Use:   "extender --listen-address HOST:PORT (--tls-cert-file FILE --tls-private-key-file FILE --client-ca-file FILE | --insecure) [--kubeconfig FILE] [--bind] [--requeue]",
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
serves call latency and errors by verb and the nodes /filter passed or failed.

It serves HTTPS and accepts scheduler calls only from a client whose certificate --client-ca-file
verifies (kube-scheduler's extender tlsConfig: certFile, keyFile; enableHTTPS: true); /healthz
and /metrics need no client certificate. --insecure serves plain HTTP to anyone who can reach
the address: for loopback demos and tests only. /bind binds only a pending, unbound pod of one of
the --scheduler-name schedulers onto a node that passes the filter now. See docs/extender.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, err := logs.context(cmd)
			if err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(listenAddress); err != nil {
				return cmdutil.BadInput(fmt.Errorf("--listen-address: %w", err))
			}
			if maxRequestBytes <= 0 {
				return cmdutil.BadInput(fmt.Errorf("--max-request-bytes: must be positive, got %d", maxRequestBytes))
			}
			if maxConcurrent <= 0 {
				return cmdutil.BadInput(fmt.Errorf("--max-concurrent-requests: must be positive, got %d", maxConcurrent))
			}
			tlsConfig, err := extenderTLS(insecure, certFile, keyFile, caFile)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			client, err := newExtenderClient(kubeconfig)
			if err != nil {
				return cmdutil.BadInput(err)
			}
			ln, err := net.Listen("tcp", listenAddress)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("requeue") {
				// --bind comes with patch on pods (the chart's RBAC), which requeueing needs.
				requeue = bind
			}
			if insecure {
				klog.FromContext(ctx).Info("Warning: --insecure: serving plain HTTP, and anyone who reaches the address may call /filter and /bind")
			}
			return extender.Run(ctx, ln, client, extender.Options{Bind: bind, Requeue: requeue, MaxRequestBytes: maxRequestBytes,
				MaxConcurrent: maxConcurrent, SchedulerNames: schedulerNames, TLS: tlsConfig, StaleAfter: staleAfter, AgentNamespace: agentNamespace})
		},
	}
	f := cmd.Flags()
	f.StringVar(&listenAddress, "listen-address", "127.0.0.1:8888", "address to serve the extender API and /healthz on")
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.BoolVar(&bind, "bind", false, "serve /bind: bind pods, recording the chosen card of GPU-sharing pods first")
	f.BoolVar(&requeue, "requeue", false, "when a node's GPUs recover, annotate the pending pods rejected there for GPU health so that the scheduler retries them (needs patch on pods; default: the value of --bind)")
	f.Int64Var(&maxRequestBytes, "max-request-bytes", extender.DefaultMaxRequestBytes, "largest request body accepted (nodeCacheCapable requests carry node names only; raise it for nodeCacheCapable: false)")
	f.IntVar(&maxConcurrent, "max-concurrent-requests", extender.DefaultMaxConcurrent, "scheduler calls served at once; more are answered 503 at once")
	f.DurationVar(&staleAfter, "stale-after", gpuhealthv1.DefaultStaleAfter, "a node whose agent's heartbeat is older (or unreadable) gets no GPU pods, saying why (0: trust every report)")
	f.StringVar(&agentNamespace, "agent-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the agents' heartbeat Leases (default: $POD_NAMESPACE; empty: read only the heartbeat annotation of agents of earlier releases)")
	f.StringSliceVar(&schedulerNames, "scheduler-name", []string{"default-scheduler"}, "schedulers whose pods /bind binds (the spec.schedulerName of the profiles that call this extender)")
	f.StringVar(&certFile, "tls-cert-file", "", "the serving certificate (PEM; with its chain)")
	f.StringVar(&keyFile, "tls-private-key-file", "", "the serving certificate's private key (PEM)")
	f.StringVar(&caFile, "client-ca-file", "", "CA bundle (PEM) that signs kube-scheduler's client certificate: scheduler calls from any other client are refused")
	f.BoolVar(&insecure, "insecure", false, "serve plain HTTP without client authentication (loopback demos and tests only)")
	logs.addFlags(f)
	return cmd
}

// extenderTLS is the extender's TLS configuration from its flags: --insecure, and only it, gives
// plain HTTP (nil); otherwise every TLS flag is required.
func extenderTLS(insecure bool, certFile, keyFile, caFile string) (*tls.Config, error) {
	if insecure {
		if certFile != "" || keyFile != "" || caFile != "" {
			return nil, errors.New("--insecure serves plain HTTP: leave out --tls-cert-file, --tls-private-key-file and --client-ca-file")
		}
		return nil, nil
	}
	var missing []string
	for _, f := range []struct{ name, value string }{{"--tls-cert-file", certFile}, {"--tls-private-key-file", keyFile}, {"--client-ca-file", caFile}} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: required to serve HTTPS to kube-scheduler alone (or --insecure for plain HTTP on loopback)", strings.Join(missing, ", "))
	}
	return extender.TLSConfig(certFile, keyFile, caFile)
}

func newExtenderClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := cmdutil.ComponentConfig(kubeconfig, "gpuhealth-extender", extenderQPS, extenderBurst)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
