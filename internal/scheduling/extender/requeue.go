package extender

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// RequeuedAtAnnotation is the pod annotation the extender sets (to the time, RFC 3339 with
// nanoseconds, so that every nudge changes the pod) when a node it rejected the pod on recovers.
// kube-scheduler moves an unschedulable pod back to its queue on any update of the pod.
const RequeuedAtAnnotation = "gpuhealth.dev/requeued-at"

const (
	// rememberFor is how long a rejection is remembered. kube-scheduler retries a parked pod at
	// least every 5 minutes (--pod-max-in-unschedulable-pods-duration), and every retry
	// remembers it anew, so a pod still waiting is never forgotten; a pod deleted while pending
	// (the pod informer only sees bound pods) is.
	rememberFor = 10 * time.Minute
	// sweepEvery is how often remember drops expired rejections.
	sweepEvery = time.Minute
	// maxRemembered bounds the (pod, node) pairs remembered, about 50 bytes each; pods rejected
	// beyond it are not remembered and wait for kube-scheduler's own retries, as without
	// requeueing.
	maxRemembered = 100_000
	// requeueWorkers patch pods in parallel; the workqueue never hands one pod to two of them.
	requeueWorkers = 2
	// requeueTries bounds the patches of one nudge: 100 ms, 200 ms, ... 12.8 s apart.
	requeueTries = 8
)

// rejectedPod is what the extender remembers of a pod it rejected because of GPU health.
type rejectedPod struct {
	namespace, name string
	// nodes are the nodes of the latest filter call that GPU health, or a node missing from the
	// cache, ruled out.
	nodes []string
	at    time.Time
}

// requeuer closes a race of nodeCacheCapable: kube-scheduler retries a pod on a Node update, the
// extender answers from its own informer, which may not have seen that update yet, and the pod is
// parked until the next cluster event. The requeuer remembers the pods /filter rejected on a node
// because of GPU health; when the node informer sees such a node able to hold more, it patches
// RequeuedAtAnnotation on each of them that is still pending, from a rate-limited workqueue,
// which makes kube-scheduler retry them against a cache that has the recovery.
type requeuer struct {
	client kubernetes.Interface
	clock  clock.WithTicker
	queue  workqueue.TypedRateLimitingInterface[types.UID]

	mu     sync.Mutex
	pods   map[types.UID]*rejectedPod
	byNode map[string]map[types.UID]struct{}
	pairs  int // sum of len(nodes) over pods
	swept  time.Time
	full   bool // a remember found no room since the last sweep (logged once per sweep)
	logger klog.Logger
}

func newRequeuer(client kubernetes.Interface, clk clock.WithTicker) *requeuer {
	// The controller default's token bucket (10 a second, bursts of 100) keeps a mass recovery
	// from taking the client's QPS away from /bind; the second limiter spaces retries of one pod.
	limiter := workqueue.NewTypedMaxOfRateLimiter(
		workqueue.DefaultTypedControllerRateLimiter[types.UID](),
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](100*time.Millisecond, 30*time.Second),
	)
	return &requeuer{
		client: client,
		clock:  clk,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[types.UID]{
			Name: "gpuhealth-extender-requeue", Clock: clk,
		}),
		pods:   map[types.UID]*rejectedPod{},
		byNode: map[string]map[types.UID]struct{}{},
		swept:  clk.Now(),
		logger: klog.Background(),
	}
}

// remember records the nodes the latest filter call ruled out for the pod because of GPU health;
// it replaces what an earlier call recorded, and no nodes forgets the pod.
func (r *requeuer) remember(uid types.UID, namespace, name string, nodes []string) {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pods[uid]; p != nil && slices.Equal(p.nodes, nodes) {
		// The common case: a parked pod retried and rejected on the same nodes.
		p.at = now
		return
	}
	r.forgetLocked(uid)
	if len(nodes) == 0 {
		return
	}
	if now.Sub(r.swept) >= sweepEvery {
		r.sweepLocked(now)
	}
	if r.pairs+len(nodes) > maxRemembered {
		if !r.full {
			r.logger.Info("Too many pods rejected because of GPU health to remember; the rest are retried on kube-scheduler's own schedule",
				"pod", klog.KRef(namespace, name), "remembered", r.pairs, "limit", maxRemembered)
			r.full = true
		}
		return
	}
	r.pods[uid] = &rejectedPod{namespace: namespace, name: name, nodes: nodes, at: now}
	r.pairs += len(nodes)
	for _, n := range nodes {
		m := r.byNode[n]
		if m == nil {
			m = map[types.UID]struct{}{}
			r.byNode[n] = m
		}
		m[uid] = struct{}{}
	}
}

// forget drops the pod with uid: it is bound (or gone).
func (r *requeuer) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetLocked(uid)
}

func (r *requeuer) forgetLocked(uid types.UID) {
	p := r.pods[uid]
	if p == nil {
		return
	}
	// An emptied node's map stays until the next sweep: the next pod rejected there reuses it.
	for _, n := range p.nodes {
		delete(r.byNode[n], uid)
	}
	r.pairs -= len(p.nodes)
	delete(r.pods, uid)
}

func (r *requeuer) sweepLocked(now time.Time) {
	r.swept, r.full = now, false
	for uid, p := range r.pods {
		if now.Sub(p.at) >= rememberFor {
			r.forgetLocked(uid)
		}
	}
	for n, m := range r.byNode {
		if len(m) == 0 {
			delete(r.byNode, n)
		}
	}
}

// due returns the pods rejected on node that are still remembered, in no particular order.
func (r *requeuer) due(node string) []types.UID {
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var uids []types.UID
	for uid := range r.byNode[node] {
		if now.Sub(r.pods[uid].at) < rememberFor {
			uids = append(uids, uid)
		}
	}
	return uids
}

// nodeImproved queues a nudge for every pod rejected on node. It only queues: the node
// informer's handler calls it.
func (r *requeuer) nodeImproved(node string) {
	uids := r.due(node)
	if len(uids) == 0 {
		return
	}
	r.logger.V(2).Info("Node can hold more GPU work; requeueing the pods rejected on it", "node", node, "pods", len(uids))
	for _, uid := range uids {
		r.queue.AddRateLimited(uid)
	}
}

// remembered returns the namespace and name of the pod with uid, if it is still remembered.
func (r *requeuer) remembered(uid types.UID) (namespace, name string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pods[uid]
	if p == nil || r.clock.Since(p.at) >= rememberFor {
		return "", "", false
	}
	return p.namespace, p.name, true
}

// run patches the queued pods until ctx ends.
func (r *requeuer) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range requeueWorkers {
		wg.Go(func() {
			for r.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	r.queue.ShutDown()
	wg.Wait()
}

func (r *requeuer) processNext(ctx context.Context) bool {
	uid, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(uid)
	namespace, name, ok := r.remembered(uid)
	if !ok {
		// Bound, or rejected again without GPU health to blame, since it was queued.
		r.queue.Forget(uid)
		return true
	}
	logger := r.logger.WithValues("pod", klog.KRef(namespace, name))
	err := r.nudge(ctx, uid, namespace, name)
	switch {
	case err == nil:
		logger.V(2).Info("Requeued a pod rejected because of GPU health on a node that recovered")
		r.queue.Forget(uid)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || apierrors.IsInvalid(err):
		// Deleted, or recreated under the same name (the UID in the patch does not match).
		logger.V(2).Info("Not requeueing a pod that is gone", "err", err)
		r.forget(uid)
		r.queue.Forget(uid)
	case ctx.Err() != nil:
		r.queue.Forget(uid)
	case r.queue.NumRequeues(uid) < requeueTries:
		logger.V(2).Info("Requeueing a pod failed; retrying", "err", err)
		r.queue.AddRateLimited(uid)
	default:
		logger.Error(err, "Requeueing a pod failed; it waits for kube-scheduler's own retry")
		r.queue.Forget(uid)
	}
	return true
}

// nudge sets RequeuedAtAnnotation with a merge patch that carries the pod's UID, so that it
// cannot land on a recreated pod of the same name. A pod bound since the node recovered (the pod
// informer has not told us yet) gets the annotation too, which does it no harm.
func (r *requeuer) nudge(ctx context.Context, uid types.UID, namespace, name string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         uid,
		"annotations": map[string]string{RequeuedAtAnnotation: r.clock.Now().UTC().Format(time.RFC3339Nano)},
	}})
	if err != nil {
		return err
	}
	_, err = r.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
