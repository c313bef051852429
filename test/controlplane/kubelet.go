package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
)

// FakeKubelet stands in for the kubelet of one fake node, doing the two things other components
// wait for: it reports pods bound to the node as Running and Ready, and it completes graceful
// deletions (a deleted pod keeps existing, with a deletionTimestamp, until its kubelet confirms
// the containers stopped). Without it, a pod evicted by a taint controller never disappears and
// its ResourceClaim stays reserved. It runs no containers and prepares no DRA resources. It acts
// with the node's identity (system:node:<node>), like a real kubelet.
type FakeKubelet struct {
	node   string
	client kubernetes.Interface
	pods   corelisters.PodLister
	queue  workqueue.TypedRateLimitingInterface[string]

	cancel context.CancelFunc
	// wg covers the worker goroutine and the informers.
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// StartKubelet starts a FakeKubelet for node and returns once it has listed the node's pods. Call
// Stop when done (StartKubeletT does that for tests).
func (c *Cluster) StartKubelet(ctx context.Context, node string) (*FakeKubelet, error) {
	cfg, err := c.NodeConfig(node)
	if err != nil {
		return nil, err
	}
	client, err := newClientset(cfg, "system:node:"+node)
	if err != nil {
		return nil, err
	}
	// The Node authorizer lets a kubelet list and watch only pods bound to it.
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	podInformer := factory.Core().V1().Pods()
	k := &FakeKubelet{
		node:   node,
		client: client,
		pods:   podInformer.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "fake-kubelet-" + node}),
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, fmt.Errorf("fake kubelet %s: watch pods: %w", node, err)
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k.cancel = cancel
	factory.Start(runCtx.Done())
	k.wg.Go(func() {
		<-runCtx.Done()
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			k.Stop()
			return nil, fmt.Errorf("fake kubelet %s: %v informer did not sync", node, typ)
		}
	}
	k.wg.Go(func() {
		for k.processNext(runCtx) {
		}
	})
	return k, nil
}

// Stop stops the FakeKubelet and waits for its goroutines. It is idempotent.
func (k *FakeKubelet) Stop() {
	k.stopOnce.Do(func() {
		k.cancel()
		k.queue.ShutDown()
		k.wg.Wait()
	})
}

func (k *FakeKubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil && ctx.Err() == nil {
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func (k *FakeKubelet) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil // not retryable
	}
	pod, err := k.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.DeletionTimestamp != nil {
		// The containers "stopped" at once: confirm the deletion, as the kubelet does once a
		// pod's containers are gone. The UID precondition keeps a same-named successor safe.
		err := k.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		return err
	}
	if pod.Status.Phase != corev1.PodPending {
		return nil
	}
	_, err = k.client.CoreV1().Pods(ns).UpdateStatus(ctx, runningStatus(pod), metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or changed: a newer event is queued already.
		return nil
	}
	return err
}

// runningStatus returns pod with a status like the kubelet reports once all containers run.
func runningStatus(pod *corev1.Pod) *corev1.Pod {
	pod = pod.DeepCopy()
	now := metav1.NewTime(time.Now())
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.HostIP = "127.0.0.1"
	pod.Status.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	for _, t := range []corev1.PodConditionType{
		corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady,
	} {
		setPodCondition(&pod.Status, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	pod.Status.ContainerStatuses = nil
	for _, ctr := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:        ctr.Name,
			Image:       ctr.Image,
			ImageID:     "fake://" + ctr.Image,
			ContainerID: fmt.Sprintf("fake://%s/%s", pod.UID, ctr.Name),
			Ready:       true,
			Started:     ptr.To(true),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	return pod
}

func setPodCondition(status *corev1.PodStatus, cond corev1.PodCondition) {
	for i := range status.Conditions {
		if status.Conditions[i].Type == cond.Type {
			status.Conditions[i] = cond
			return
		}
	}
	status.Conditions = append(status.Conditions, cond)
}
