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
	"strings"
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

	"github.com/gpuhealth/gpuhealth/internal/kube"
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
	// published is the annotation's value as last written (nil: not yet).
	published *string
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
	return &Evictor{
		opts: opts, trigger: make(chan struct{}, 1), pending: map[string]gpuhealthv1.GPUEvictions{},
		since: map[string]time.Time{}, pods: map[types.UID]*podState{}, noticed: map[string]bool{},
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

// Run works until ctx is done: a round on every Update and every Retry.
func (e *Evictor) Run(ctx context.Context) error {
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

// target is one GPU (with its MIG instances) or a MIG instance alone that asks for eviction.
type target struct {
	gpu  health.Device
	migs []health.Device
}

func targets(snap health.Snapshot) []target {
	evicting := map[string]bool{}
	for _, d := range snap.Devices {
		if d.Device.MIG == nil && d.Evict {
			evicting[d.Device.UUID] = true
		}
	}
	var out []target
	for _, d := range snap.Devices {
		switch {
		case !d.Evict:
		case d.Device.MIG == nil:
			t := target{gpu: d.Device}
			for _, m := range snap.Devices {
				if m.Device.MIG != nil && m.Device.MIG.ParentUUID == d.Device.UUID {
					t.migs = append(t.migs, m.Device)
				}
			}
			out = append(out, t)
		case !evicting[d.Device.MIG.ParentUUID]:
			out = append(out, target{gpu: d.Device})
		}
	}
	return out
}

// Round looks once at every GPU that asks for eviction.
func (e *Evictor) Round(ctx context.Context) {
	e.mu.Lock()
	snap := e.snap
	e.mu.Unlock()
	now := e.opts.Clock.Now()
	pending := map[string]gpuhealthv1.GPUEvictions{}
	seen := map[string]bool{}
	held := map[types.UID]bool{}
	known := true
	for _, t := range targets(snap) {
		uuid := t.gpu.UUID
		seen[uuid] = true
		if _, ok := e.since[uuid]; !ok {
			e.since[uuid] = now
		}
		p, ok := e.gpu(ctx, t, now, held)
		known = known && ok
		if len(p) > 0 {
			pending[uuid] = gpuhealthv1.GPUEvictions{Index: t.gpu.Index, Pods: p}
		}
	}
	for uuid := range e.since {
		if !seen[uuid] {
			delete(e.since, uuid) // it no longer asks: a later fault starts a new grace period
		}
	}
	if known {
		e.forget(held)
	}
	e.mu.Lock()
	changed := !equalPending(e.pending, pending)
	e.pending = pending
	e.mu.Unlock()
	if err := e.publish(ctx, pending); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot publish the pending evictions; retrying")
	}
	if changed && e.opts.Changed != nil {
		e.opts.Changed()
	}
}

// forget drops what the Evictor keeps of the pods that no GPU asking for eviction holds (their
// backoff, their Events already recorded): when a GPU asks again later, its pods are a new case,
// and what a long-running agent keeps stays bounded by the pods it is evicting.
func (e *Evictor) forget(held map[types.UID]bool) {
	for uid := range e.pods {
		if !held[uid] {
			delete(e.pods, uid)
		}
	}
	for key := range e.noticed {
		if uid, _, _ := strings.Cut(key, "/"); uid != "node" && !held[types.UID(uid)] {
			delete(e.noticed, key)
		}
	}
}

// gpu evicts what it may of one GPU's pods and returns the pods whose eviction is pending. It
// marks each holder it read in held; ok is false when it could not tell (or read) them all.
func (e *Evictor) gpu(ctx context.Context, t target, now time.Time, held map[types.UID]bool) (_ []gpuhealthv1.PodEviction, ok bool) {
	logger := klog.FromContext(ctx).WithValues("gpu", t.gpu.UUID, "index", t.gpu.Index)
	holders, err := e.find(ctx, t)
	if err != nil {
		// Do not know: nothing of this GPU is evicted; say so once per distinct error.
		e.noticeNode(corev1.EventTypeWarning, "GPUEvictionUnknown",
			fmt.Sprintf("GPU %d (%s) asks for eviction but the pods holding it are unknown, so none is evicted: %v", t.gpu.Index, t.gpu.UUID, err))
		logger.Error(err, "Cannot tell which pods hold the GPU; evicting none")
		return nil, false
	}
	ok = true
	var pending []gpuhealthv1.PodEviction
	var admitted *bool
	for _, h := range holders {
		pod, err := e.opts.Client.CoreV1().Pods(h.Namespace).Get(ctx, h.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			logger.Error(err, "Cannot read a pod holding the GPU; retrying", "pod", h.String())
			ok = false
			continue
		}
		held[pod.UID] = true
		if reason := e.skip(pod); reason != "" {
			if reason != skipSilently {
				e.noticePod(pod, corev1.EventTypeNormal, "GPUEvictionSkipped",
					fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; not evicted: %s", t.gpu.Index, t.gpu.UUID, reason))
			}
			continue
		}
		st := e.pods[pod.UID]
		if st == nil {
			st = &podState{since: now}
			e.pods[pod.UID] = st
		}
		entry := gpuhealthv1.PodEviction{Pod: h.String(), Via: h.Via, Since: st.since}
		switch {
		case slices.Contains(e.opts.ReportOnlyNamespaces, pod.Namespace):
			entry.State = gpuhealthv1.EvictionReportOnly
			e.noticePod(pod, corev1.EventTypeWarning, "GPUEvictionReportOnly",
				fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; namespace %s is report-only", t.gpu.Index, t.gpu.UUID, pod.Namespace))
		case e.opts.DryRun:
			entry.State = gpuhealthv1.EvictionDryRun
			e.noticePod(pod, corev1.EventTypeWarning, "GPUEvictionDryRun",
				fmt.Sprintf("pod holds GPU %d (%s), which asks for eviction; dry run: it would be evicted", t.gpu.Index, t.gpu.UUID))
		case now.Before(e.since[t.gpu.UUID].Add(e.opts.GracePeriod)):
			entry.State = gpuhealthv1.EvictionWaiting
		case st.done || now.Before(st.next):
			if st.done {
				continue
			}
			entry.State = gpuhealthv1.EvictionBlocked
		default:
			if admitted == nil {
				ok := e.admit(ctx, t.gpu)
				admitted = &ok
			}
			if !*admitted {
				entry.State = gpuhealthv1.EvictionHeld
				break
			}
			if e.evict(ctx, pod, h, t.gpu, st, now) {
				continue
			}
			entry.State = gpuhealthv1.EvictionBlocked
		}
		pending = append(pending, entry)
	}
	return pending, ok
}

const skipSilently = "-"

// skip says why a pod is not evicted ("" when it may be).
func (e *Evictor) skip(pod *corev1.Pod) string {
	switch {
	case pod.Spec.NodeName != e.opts.NodeName:
		return skipSilently // the kubelet's answer is stale: not a pod of this node
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed || pod.DeletionTimestamp != nil:
		return skipSilently // gone or going
	case pod.Namespace+"/"+pod.Name == e.opts.Self:
		return skipSilently
	case slices.Contains(e.opts.ExcludeNamespaces, pod.Namespace):
		return skipSilently
	case !e.opts.DaemonSetPods && ownedByDaemonSet(pod):
		return "it is a DaemonSet's pod (agent.eviction.daemonSetPods is off)"
	}
	return ""
}

func ownedByDaemonSet(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.OwnerReferences, func(o metav1.OwnerReference) bool {
		return o.Kind == "DaemonSet" && o.Controller != nil && *o.Controller
	})
}

// find asks every finder; any error is "do not know".
func (e *Evictor) find(ctx context.Context, t target) ([]Holder, error) {
	var out []Holder
	for _, f := range e.opts.Finders {
		found, err := f.Find(ctx, t.gpu, t.migs)
		if err != nil {
			return nil, err
		}
		for _, w := range found.Warnings {
			e.noticeNode(corev1.EventTypeWarning, "GPUEvictionPodWarning", fmt.Sprintf("GPU %d (%s) asks for eviction: %s", t.gpu.Index, t.gpu.UUID, w))
		}
		out = append(out, found.Holders...)
	}
	slices.SortFunc(out, func(a, b Holder) int {
		if c := compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return compare(a.Name, b.Name)
	})
	return slices.CompactFunc(out, func(a, b Holder) bool { return a.Namespace == b.Namespace && a.Name == b.Name }), nil
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (e *Evictor) admit(ctx context.Context, gpu health.Device) bool {
	if e.opts.Breaker == nil {
		return true
	}
	ok, err := e.opts.Breaker.Admit(ctx, gpu.UUID)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Circuit breaker; holding the GPU's evictions", "gpu", gpu.UUID)
		return false
	}
	if !ok {
		e.noticeNode(corev1.EventTypeWarning, "GPUEvictionHeld",
			fmt.Sprintf("GPU %d (%s) asks for eviction, but the circuit breaker's budget is spent: its pods stay until it is acknowledged (`gpuhealth breaker ack`) or the wave leaves the window", gpu.Index, gpu.UUID))
	}
	return ok
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

// noticeNode records a Node Event once per distinct message.
func (e *Evictor) noticeNode(eventType, reason, msg string) {
	key := "node/" + reason + "/" + msg
	if e.noticed[key] {
		return
	}
	e.noticed[key] = true
	e.opts.Recorder.Event(e.opts.NodeRef, eventType, reason, msg)
}

// noticePod records a pod Event once per pod and reason.
func (e *Evictor) noticePod(pod *corev1.Pod, eventType, reason, msg string) {
	key := string(pod.UID) + "/" + reason
	if e.noticed[key] {
		return
	}
	e.noticed[key] = true
	e.opts.Recorder.Event(pod, eventType, reason, msg)
}

func equalPending(a, b map[string]gpuhealthv1.GPUEvictions) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Index != w.Index || !slices.Equal(v.Pods, w.Pods) {
			return false
		}
	}
	return true
}
