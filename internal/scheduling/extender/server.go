// Package extender is gpuhealth's kube-scheduler HTTP extender: /filter, /prioritize and /bind
// speaking k8s.io/kube-scheduler/extender/v1. It decodes the scheduler's request, asks the pure
// placement package (internal/scheduling) about each node, and encodes the answer. Node health
// comes from the Node objects in the request (nodeCacheCapable: false) or from a node informer
// (nodeCacheCapable: true); what the pods on each node hold comes from a pod informer. No request
// costs an API call, except /bind, which reads the pod it binds, records the chosen card on it
// and creates the Binding. With Options.Requeue, a workqueue nudges the pods /filter rejected
// because of GPU health once a node they were rejected on recovers (see requeuer).
package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/httpserve"
	"github.com/gpuhealth/gpuhealth/internal/scheduling"
)

// DefaultMaxRequestBytes bounds a request body. With nodeCacheCapable: false the scheduler sends
// every candidate Node object; 5,000 nodes of ~20 KiB each fit.
const DefaultMaxRequestBytes = 128 << 20

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
	// bindMu makes choosing a card and charging it one step, so two binds in flight never pick
	// the same last free memory.
	bindMu sync.Mutex
	logger klog.Logger
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
	s := &Server{client: client, opts: opts, state: newState(), logger: klog.Background()}
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
	if err := s.state.start(ctx, s.client, l); err != nil {
		return err
	}
	s.ready.Store(true)
	return nil
}

// Handler serves /filter, /prioritize, /bind and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /filter", s.serveFilter)
	mux.HandleFunc("POST /prioritize", s.servePrioritize)
	mux.HandleFunc("POST /bind", s.serveBind)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.ready.Load() {
			http.Error(w, "informer caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	return mux
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
	return httpserve.Serve(ctx, ln, s.Handler(),
		httpserve.WithShutdownTimeout(s.opts.ShutdownTimeout), httpserve.WithReadHeaderTimeout(readHeaderTimeout))
}

// decode reads a JSON request body of at most MaxRequestBytes into v.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body := http.MaxBytesReader(w, r.Body, s.opts.MaxRequestBytes)
	if err := json.NewDecoder(body).Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body is larger than %d bytes", tooBig.Limit)
		}
		return fmt.Errorf("decode request: %w", err)
	}
	return nil
}

func (s *Server) reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		s.logger.V(2).Info("Writing a reply failed", "err", err)
	}
}

// errorReply is the body of a request that could not be decoded; kube-scheduler only sees the
// status code, a person with curl sees why.
type errorReply struct {
	Error string
}

func (s *Server) serveFilter(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderFilterResult{Error: err.Error()})
		return
	}
	result := s.Filter(r.Context(), &args)
	s.reply(w, http.StatusOK, result)
}

// Filter answers one filter call.
func (s *Server) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	if args.Pod == nil {
		return &extenderv1.ExtenderFilterResult{Error: "request has no pod"}
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(args.Pod))
	req := scheduling.PodRequest(args.Pod)
	result, retryOn := s.filter(logger, args, req)
	if s.requeue != nil && args.NodeNames != nil && args.Pod.UID != "" && args.Pod.Spec.NodeName == "" {
		s.requeue.remember(args.Pod.UID, args.Pod.Namespace, args.Pod.Name, retryOn)
	}
	if result.Error == "" {
		logger.V(4).Info("Filtered", "request", req, "failed", len(result.FailedNodes))
	}
	return result
}

// filter is Filter under the state's read lock. retryOn lists the nodes named in the request
// that GPU health (or a node missing from the cache) ruled out, when Options.Requeue is on: the
// pod is worth retrying when one of them gets better. With Node objects in the request the
// extender judges the scheduler's own view of the nodes, so the scheduler's own Node events
// already retry the pod, and nothing is collected.
func (s *Server) filter(logger klog.Logger, args *extenderv1.ExtenderArgs, req scheduling.Request) (result *extenderv1.ExtenderFilterResult, retryOn []string) {
	failed := extenderv1.FailedNodesMap{}
	result = &extenderv1.ExtenderFilterResult{FailedNodes: failed}
	s.state.mu.RLock()
	defer s.state.mu.RUnlock()
	switch {
	case args.NodeNames != nil:
		names := make([]string, 0, len(*args.NodeNames))
		var scratch []scheduling.GPU
		for _, name := range *args.NodeNames {
			node, _ := s.state.nodeLocked(name, nil)
			if node == nil {
				failed[name] = "node is not in the gpuhealth extender's cache yet"
				if s.requeue != nil {
					retryOn = append(retryOn, name)
				}
				continue
			}
			used := s.state.usageLocked(name)
			if fits, reason := scheduling.Filter(req, node, used); !fits {
				failed[name] = reason
				if s.requeue != nil && healthBlocks(req, node, used, &scratch) {
					retryOn = append(retryOn, node.Name) // the cache's string, shared by all pods
				}
				continue
			}
			names = append(names, name)
		}
		result.NodeNames = &names
	case args.Nodes != nil:
		kept := &corev1.NodeList{Items: make([]corev1.Node, 0, len(args.Nodes.Items))}
		for i := range args.Nodes.Items {
			n := &args.Nodes.Items[i]
			node, warnings := s.state.nodeLocked(n.Name, n)
			for _, w := range warnings {
				logger.V(2).Info("Ignoring part of a GPU health annotation", "node", klog.KObj(n), "warning", w)
			}
			if fits, reason := scheduling.Filter(req, node, s.state.usageLocked(n.Name)); !fits {
				failed[n.Name] = reason
				continue
			}
			kept.Items = append(kept.Items, *n)
		}
		result.Nodes = kept
	default:
		return &extenderv1.ExtenderFilterResult{Error: "request has neither Nodes nor NodeNames"}, nil
	}
	return result, retryOn
}

func (s *Server) servePrioritize(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return
	}
	list, err := s.Prioritize(r.Context(), &args)
	if err != nil {
		s.reply(w, http.StatusBadRequest, errorReply{Error: err.Error()})
		return
	}
	s.reply(w, http.StatusOK, list)
}

// Prioritize scores each candidate node 0..10 (extenderv1.MaxExtenderPriority).
func (s *Server) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	if args.Pod == nil {
		return nil, errors.New("request has no pod")
	}
	req := scheduling.PodRequest(args.Pod)
	s.state.mu.RLock()
	defer s.state.mu.RUnlock()
	var list extenderv1.HostPriorityList
	score := func(name string, n *corev1.Node) {
		node, _ := s.state.nodeLocked(name, n)
		var sc int64
		if node != nil {
			sc = scheduling.Score(req, node, s.state.usageLocked(name))
		}
		list = append(list, extenderv1.HostPriority{Host: name, Score: sc})
	}
	switch {
	case args.NodeNames != nil:
		list = make(extenderv1.HostPriorityList, 0, len(*args.NodeNames))
		for _, name := range *args.NodeNames {
			score(name, nil)
		}
	case args.Nodes != nil:
		list = make(extenderv1.HostPriorityList, 0, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			score(args.Nodes.Items[i].Name, &args.Nodes.Items[i])
		}
	default:
		return nil, errors.New("request has neither Nodes nor NodeNames")
	}
	klog.FromContext(ctx).V(4).Info("Prioritized", "pod", klog.KObj(args.Pod), "request", req, "scores", list)
	return list, nil
}

func (s *Server) serveBind(w http.ResponseWriter, r *http.Request) {
	var args extenderv1.ExtenderBindingArgs
	if err := s.decode(w, r, &args); err != nil {
		s.reply(w, http.StatusBadRequest, extenderv1.ExtenderBindingResult{Error: err.Error()})
		return
	}
	var result extenderv1.ExtenderBindingResult
	if err := s.Bind(r.Context(), &args); err != nil {
		result.Error = err.Error()
	}
	s.reply(w, http.StatusOK, result)
}

// Bind binds a pod to the node the scheduler chose. For a GPU-sharing pod it first chooses a
// healthy card with room and records it on the pod (volcano.sh/gpu-index and, when the agent
// reported one, gpuhealth.dev/gpu-uuid), so the device plugin and Volcano know which card to
// use. What the pod holds is charged at once, before the pod informer sees the binding, so the
// next pod's filter already counts it.
func (s *Server) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	if !s.opts.Bind {
		return errors.New("binding is off (start the extender with --bind)")
	}
	if args.PodName == "" || args.PodNamespace == "" || args.Node == "" {
		return errors.New("binding request needs PodName, PodNamespace and Node")
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node)
	pods := s.client.CoreV1().Pods(args.PodNamespace)
	pod, err := pods.Get(ctx, args.PodName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read pod: %w", err)
	}
	if args.PodUID != "" && pod.UID != args.PodUID {
		return fmt.Errorf("pod %s/%s is now UID %s, not %s", args.PodNamespace, args.PodName, pod.UID, args.PodUID)
	}
	req := scheduling.PodRequest(pod)
	hold := scheduling.Hold{Node: args.Node, GPUs: req.GPUs, Card: scheduling.NoCard}

	s.bindMu.Lock()
	if req.MemoryMiB > 0 {
		s.state.mu.RLock()
		node, _ := s.state.nodeLocked(args.Node, nil)
		var p scheduling.Placement
		if node != nil {
			p = scheduling.Place(req, node, s.state.usageLocked(args.Node))
		}
		var uuid string
		if node != nil && p.Fits {
			uuid = node.UUIDOf(p.Card)
		}
		s.state.mu.RUnlock()
		switch {
		case node == nil:
			s.bindMu.Unlock()
			return fmt.Errorf("node %s is not in the extender's cache", args.Node)
		case !p.Fits:
			s.bindMu.Unlock()
			return fmt.Errorf("node %s: %s", args.Node, p.Reason)
		}
		hold.Card, hold.MemoryMiB = p.Card, req.MemoryMiB
		if err := s.recordCard(ctx, pod, p.Card, uuid); err != nil {
			s.bindMu.Unlock()
			return err
		}
		logger = logger.WithValues("card", p.Card, "uuid", uuid)
	}
	// Charged before the Binding exists; undone if it fails. The pod informer's own event for the
	// bound pod replaces this entry (same UID).
	if !req.IsZero() {
		s.state.assume(pod.UID, hold)
	}
	s.bindMu.Unlock()

	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	if err := pods.Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
		s.state.forget(pod.UID)
		return fmt.Errorf("bind: %w", err)
	}
	if s.requeue != nil {
		s.requeue.forget(pod.UID) // bound: nothing to retry
	}
	logger.V(2).Info("Bound pod")
	return nil
}

// recordCard writes the chosen card on the pod with a merge patch that carries the pod's UID, so
// it cannot land on a recreated pod of the same name.
func (s *Server) recordCard(ctx context.Context, pod *corev1.Pod, card int, uuid string) error {
	ann := map[string]any{scheduling.GPUIndexAnnotation: strconv.Itoa(card)}
	if uuid != "" {
		ann[scheduling.GPUUUIDAnnotation] = uuid
	} else {
		ann[scheduling.GPUUUIDAnnotation] = nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": ann}})
	if err != nil {
		return err
	}
	if _, err := s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("record card %d on the pod: %w", card, err)
	}
	return nil
}
