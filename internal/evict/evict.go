// Package evict evicts the pods that hold a GPU whose condition asks for eviction (XID 79, a
// lost GPU, ...) on the paths where nothing else does: device-plugin pods (found through the
// kubelet's pod-resources API) and Volcano GPU-sharing pods (by their card annotation). DRA pods
// are the device-taint controller's (a NoExecute DeviceTaintRule): this package never finds
// them, so a DRA pod is evicted once, by the controller.
//
// Every eviction goes through the Eviction API, so PodDisruptionBudgets are honoured; a 429 is
// retried with backoff. It is bounded: a GPU's pods are evicted only once the circuit breaker
// admits the GPU (the same slot its NoExecute/NoSchedule taint takes), some namespaces are
// excluded or only reported, and dry-run mode evicts nothing and lists what it would evict on
// the Node (gpuhealth.dev/gpu-evictions, shown by `gpuhealth status`). Not knowing who holds a
// GPU (the kubelet's socket unreachable) evicts nothing and says so in an Event.
package evict

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/report"
	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Admitter is the circuit breaker (breaker.Breaker): a GPU's pods are evicted only once it
// admits the GPU.
type Admitter interface {
	Admit(ctx context.Context, uuid string) (bool, error)
}

// Options configure an Evictor. NodeName, Client, Evicter and Finders are required.
type Options struct {
	NodeName string
	Client   kube.Interface
	Evicter  kube.Evicter
	Finders  []Finder
	// Breaker, when set, must admit a GPU before its pods are evicted (not in dry-run mode).
	Breaker Admitter
	// Recorder gets an Event on the pod and on the Node (NodeRef) per eviction.
	Recorder record.EventRecorder
	NodeRef  *corev1.ObjectReference
	Clock    clock.WithTicker
	// Self is the agent's own pod, namespace/name: never evicted.
	Self string

	DryRun               bool
	GracePeriod          time.Duration
	ExcludeNamespaces    []string
	ReportOnlyNamespaces []string
	DaemonSetPods        bool
	// Retry is how often the GPUs that ask for eviction are looked at again (default 10s); a
	// blocked pod backs off from it, doubling up to MaxBackoff.
	Retry time.Duration
	// Changed, when set, is called after a round whose pending evictions (Pending) changed.
	Changed func()
	// Nodes, when set, is the agent's shared cache of this Node, which the pending evictions
	// are written by; nil gives the Evictor one of its own.
	Nodes *nodecache.Cache
}

// MaxBackoff bounds the wait between two evictions of a pod a PodDisruptionBudget blocks.
const MaxBackoff = 5 * time.Minute

// Evictor evicts the pods of the GPUs that ask for it. Update hands it snapshots; Run works.
type Evictor struct {
	opts    Options
	trigger chan struct{}

	mu      sync.Mutex
	snap    health.Snapshot
	pending map[string]gpuhealthv1.GPUEvictions

	// Owned by Run's goroutine.
	since   map[string]time.Time // GPU UUID -> when it was first seen asking for eviction
	pods    map[types.UID]*podState
	noticed map[string]bool // Events already recorded, by key

	// nodes and writer publish the pending evictions on the Node (annotation.go).
	nodes  *nodecache.Cache
	writer *report.AnnotationWriter
}

type podState struct {
	next    time.Time
	backoff time.Duration
	since   time.Time
	done    bool
}

// New returns an Evictor.
func New(opts Options) (*Evictor, error) {
	if opts.NodeName == "" || opts.Client == nil || opts.Evicter == nil || len(opts.Finders) == 0 {
		return nil, errors.New("evict: node name, client, evicter and finders are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Retry <= 0 {
		opts.Retry = 10 * time.Second
	}
	if opts.Recorder == nil {
		opts.Recorder = &record.FakeRecorder{}
	}
	if opts.NodeRef == nil {
		opts.NodeRef = &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: opts.NodeName}
	}
	nodes := opts.Nodes
	if nodes == nil {
		nodes = nodecache.New(opts.Client, opts.NodeName)
	}
	return &Evictor{
		opts: opts, trigger: make(chan struct{}, 1), pending: map[string]gpuhealthv1.GPUEvictions{},
		since: map[string]time.Time{}, pods: map[types.UID]*podState{}, noticed: map[string]bool{},
		nodes: nodes, writer: report.NewAnnotationWriter(opts.Client, nodes, gpuhealthv1.EvictionsKey),
	}, nil
}

// Update hands the Evictor the latest snapshot; it never blocks.
func (e *Evictor) Update(snap health.Snapshot) {
	e.mu.Lock()
	e.snap = snap
	e.mu.Unlock()
	e.Trigger()
}

// Trigger asks for a round now (the breaker's budget may have freed up).
func (e *Evictor) Trigger() {
	select {
	case e.trigger <- struct{}{}:
	default:
	}
}

// Pending returns the evictions held back now, by GPU UUID.
func (e *Evictor) Pending() map[string]gpuhealthv1.GPUEvictions {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]gpuhealthv1.GPUEvictions, len(e.pending))
	for k, v := range e.pending {
		v.Pods = slices.Clone(v.Pods)
		out[k] = v
	}
	return out
}

// Run works until ctx is done: a round on every Update, every Retry and every change of the
// annotation by someone else.
func (e *Evictor) Run(ctx context.Context) error {
	if err := e.startPublishing(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}
	t := e.opts.Clock.NewTicker(e.opts.Retry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.trigger:
		case <-t.C():
		}
		e.Round(ctx)
	}
}

// evict evicts one pod and reports whether it is done with (evicted or gone).
func (e *Evictor) evict(ctx context.Context, pod *corev1.Pod, h Holder, gpu health.Device, st *podState, now time.Time) bool {
	uid := pod.UID
	err := e.opts.Evicter.Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	})
	switch {
	case err == nil:
		st.done = true
		msg := fmt.Sprintf("evicted: it holds GPU %d (%s) through %s, and the GPU asks for eviction", gpu.Index, gpu.UUID, h.Via)
		e.opts.Recorder.Event(pod, corev1.EventTypeWarning, "GPUEvicted", msg)
		e.opts.Recorder.Eventf(e.opts.NodeRef, corev1.EventTypeWarning, "GPUEvicted", "pod %s %s", h.String(), msg)
		klog.FromContext(ctx).Info("Evicted a pod holding a GPU that asks for eviction", "pod", klog.KObj(pod), "gpu", gpu.UUID, "via", h.Via)
		return true
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		st.done = true // gone, or another pod of that name now
		return true
	}
	st.backoff = min(max(2*st.backoff, e.opts.Retry), MaxBackoff)
	st.next = now.Add(st.backoff)
	if apierrors.IsTooManyRequests(err) {
		e.noticePod(pod, corev1.EventTypeWarning, "GPUEvictionBlocked",
			fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; the Eviction API refused (retried with backoff): %v", gpu.Index, gpu.UUID, err))
		return false
	}
	klog.FromContext(ctx).Error(err, "Eviction failed; retrying with backoff", "pod", klog.KObj(pod), "backoff", st.backoff)
	return false
}
