// Package extender is gpuhealth's kube-scheduler HTTP extender: /filter, /prioritize and /bind
// speaking k8s.io/kube-scheduler/extender/v1, and /metrics. It decodes the scheduler's request,
// asks the pure placement package (internal/scheduling) for its verdict on each node
// (scheduling.Judge), and encodes the answer: the decisions are all there, and this package is
// the HTTP, the informers and the bookkeeping. Node health
// comes from the Node objects in the request (nodeCacheCapable: false) or from a node informer
// (nodeCacheCapable: true); what the pods on each node hold comes from a pod informer. No request
// costs an API call, except /bind, which reads the pod it binds, records the chosen card on it
// and creates the Binding. With Options.Requeue, a workqueue nudges the pods /filter rejected
// because of GPU health once a node they were rejected on recovers (see requeuer).
//
// The files follow the jobs: server.go the Server's life (New, Start, Run), handlers.go the HTTP
// glue, wire.go the hand-written JSON of the nodeCacheCapable /filter call, filter.go /filter and
// /prioritize, bind.go /bind, state.go what the informers (informers.go) learn, requeue.go the
// requeuer, metrics.go what /metrics exports.
package extender

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/httpserve"
)

// DefaultMaxRequestBytes bounds a request body: a nodeCacheCapable request (the pod and node
// names; the chart configures that) of 5,000 nodes is far smaller. With nodeCacheCapable: false
// the scheduler sends whole Node objects: raise --max-request-bytes then.
const DefaultMaxRequestBytes = 8 << 20

// DefaultMaxConcurrent bounds the requests served at once; more are answered 503 at once, so a
// flood of slow clients holds at most this many bodies in memory.
const DefaultMaxConcurrent = 64

// Timeouts of a connection: a request must arrive whole within readTimeout and its answer be
// written within writeTimeout (kube-scheduler's httpTimeout is 5 s by default); a kept-alive
// connection may idle idleTimeout.
const (
	readTimeout  = 30 * time.Second
	writeTimeout = 30 * time.Second
	idleTimeout  = 2 * time.Minute
)

// Defaults of Options.
const (
	defaultShutdownTimeout = 10 * time.Second
	// readHeaderTimeout is generous: kube-scheduler keeps its connections alive between calls.
	readHeaderTimeout = 10 * time.Second
)

// Options configure the extender.
type Options struct {
	// Bind serves /bind: the extender binds the pods the scheduler hands it, recording the card
	// of a GPU-sharing pod first. Without it /bind answers an error.
	Bind bool
	// Requeue remembers the pods /filter rejected on a node (named in the request, that is
	// nodeCacheCapable: true) because of GPU health, and patches RequeuedAtAnnotation on those
	// still pending when the node informer sees that node recover, so that kube-scheduler retries
	// them against the updated cache. It needs patch on pods. `gpuhealth extender` turns it on
	// with --bind, with which the chart's RBAC grants that.
	Requeue bool
	// Clock is the time source of Requeue; nil means the real clock.
	Clock clock.WithTicker
	// MaxRequestBytes bounds a request body; 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// ShutdownTimeout bounds draining requests on shutdown; 0 means 10 s.
	ShutdownTimeout time.Duration
	// MaxConcurrent bounds the scheduler calls served at once; 0 means DefaultMaxConcurrent.
	MaxConcurrent int
	// BodyTimeout bounds how long a scheduler call's body may take to arrive, so that a slow
	// client holds a call slot no longer; 0 means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// StaleAfter: a node whose agent's heartbeat (gpuhealth.dev/gpu-health-heartbeat) is older,
	// or unreadable, fails the filter for GPU pods, saying why (the scheduler puts the reason in
	// the pod's FailedScheduling Event). 0 trusts every report; nodes without a heartbeat are
	// judged as before. `gpuhealth extender` defaults to gpuhealthv1.DefaultStaleAfter.
	StaleAfter time.Duration
	// AgentNamespace is where the agents renew their heartbeat Leases (the chart's namespace);
	// empty reads only the heartbeat annotation of agents of earlier releases.
	AgentNamespace string
	// SchedulerNames are the schedulers whose pods /bind binds (default: "default-scheduler").
	SchedulerNames []string
	// TLS, when set, serves HTTPS; with TLS.ClientCAs set, /filter, /prioritize and /bind need a
	// client certificate that verifies against them (kube-scheduler's tlsConfig certFile and
	// keyFile), while /healthz and /metrics do not (the kubelet's probes and Prometheus present
	// none). Nil serves plain HTTP (`gpuhealth extender --insecure`: loopback demos and tests).
	TLS *tls.Config
}

// Server answers the scheduler. Create it with New, then Start it (or use Run).
type Server struct {
	client kubernetes.Interface
	opts   Options
	state  *state
	// requeue is nil without Options.Requeue; workers waits for its goroutine.
	requeue *requeuer
	workers sync.WaitGroup
	ready   atomic.Bool
	metrics *metrics
	// bindMu makes choosing a card, recording it and charging it one step, so two binds in
	// flight never pick the same last free memory. Only reserve takes it.
	bindMu sync.Mutex
	// buffers holds *filterBuffers between /filter calls.
	buffers sync.Pool
	// inFlight holds a token per scheduler call being served (Options.MaxConcurrent).
	inFlight chan struct{}
	logger   klog.Logger
}

// New returns a Server that reads the cluster through client.
func New(client kubernetes.Interface, opts Options) *Server {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = defaultShutdownTimeout
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.MaxConcurrent <= 0 {
		opts.MaxConcurrent = DefaultMaxConcurrent
	}
	if len(opts.SchedulerNames) == 0 {
		opts.SchedulerNames = []string{corev1.DefaultSchedulerName}
	}
	s := &Server{inFlight: make(chan struct{}, opts.MaxConcurrent), client: client, opts: opts, state: newState(), metrics: newMetrics(), logger: klog.Background()}
	s.metrics.watchStaleness(s.state, opts.Clock, opts.StaleAfter)
	s.state.staleAfter, s.state.clock = opts.StaleAfter, opts.Clock
	if opts.Requeue {
		s.requeue = newRequeuer(client, opts.Clock)
	}
	return s
}

// Start runs the node and pod informers (and with Options.Requeue the requeue workers) until ctx
// ends and returns once the caches are filled; /healthz answers OK from then on.
func (s *Server) Start(ctx context.Context) error {
	s.logger = klog.FromContext(ctx)
	var l listener
	if s.requeue != nil {
		s.requeue.logger = s.logger.WithValues("controller", "requeue")
		l = s.requeue
		s.workers.Go(func() { s.requeue.run(ctx) })
	}
	if err := s.state.start(ctx, s.client, s.opts.AgentNamespace, l); err != nil {
		return err
	}
	s.ready.Store(true)
	return nil
}

// Run starts the informers, then serves on ln until ctx ends, then drains requests for up to
// Options.ShutdownTimeout, and returns once the requests and the requeue workers are done. It is
// what `gpuhealth extender` runs.
func Run(ctx context.Context, ln net.Listener, client kubernetes.Interface, opts Options) error {
	ctx, cancel := context.WithCancel(ctx)
	s := New(client, opts)
	defer func() {
		cancel()
		s.workers.Wait()
	}()
	if err := s.Start(ctx); err != nil {
		_ = ln.Close()
		return err
	}
	klog.FromContext(ctx).Info("Serving the scheduler extender", "address", ln.Addr().String(), "bind", s.opts.Bind)
	serveOpts := []httpserve.Option{httpserve.WithShutdownTimeout(s.opts.ShutdownTimeout), httpserve.WithReadHeaderTimeout(readHeaderTimeout),
		httpserve.WithTimeouts(readTimeout, writeTimeout, idleTimeout)}
	if s.opts.TLS != nil {
		serveOpts = append(serveOpts, httpserve.WithTLS(s.opts.TLS))
	}
	return httpserve.Serve(ctx, ln, s.Handler(), serveOpts...)
}
