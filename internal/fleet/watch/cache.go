package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/fleet"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

// Input is one reading of the cluster, for one judgement.
type Input struct {
	// Nodes are the Nodes as fleet.CollectedNode keeps them.
	Nodes []*corev1.Node
	// Pods are the running pods that give a workload a GPU.
	Pods []fleet.WorkloadPod
	// PodsErr says why there are no pods to read (Forbidden, or not read yet): the judgement has
	// no workloads.
	PodsErr error
	// Claims are the devices of the driver each ResourceClaim is allocated ("namespace/name"),
	// Devices the GPU each device is (fleet.HoldClaims joins them to the pods).
	Claims  map[string][]dra.DeviceID
	Devices map[dra.DeviceID]string
	// ClaimsErr says why there are no claims to read (Forbidden, or not read yet): pods count
	// for their workloads without the GPUs they hold through claims.
	ClaimsErr error
}

// runningPods selects the pods a judgement reads: a pod that stops running leaves the watch.
var runningPods = fields.OneTermEqualSelector("status.phase", string(corev1.PodRunning)).String()

// clusterCache reads the cluster for the Watcher: an informer of the Nodes that keeps what
// fleet.CollectedNode keeps, a podCache fed by a reflector of the running pods, started once
// pods may be listed, and a claimCache, started once claims and slices may be listed.
type clusterCache struct {
	client kube.Interface
	nodes  cache.SharedIndexInformer
	// pods is nil until pods may be listed and its reflector runs.
	pods *podCache
	// forbidden is true while pods may not be listed (logged once each time it becomes so).
	forbidden bool
	claims    claimCache
	wg        sync.WaitGroup
}

func newClusterCache(client kube.Interface, labels []string, driver string) (*clusterCache, error) {
	nodes := kube.NewInformer(client, client.CoreV1().Nodes(), &corev1.Node{}, nil)
	if err := nodes.SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			return fleet.CollectedNode(n, labels), nil
		}
		return obj, nil // a tombstone
	}); err != nil {
		return nil, err
	}
	return &clusterCache{client: client, nodes: nodes, claims: claimCache{client: client, driver: driver, attrs: dra.DefaultAttributes()}}, nil
}

// start starts the Nodes' informer and, if pods may be listed, the pods' reflector (and if
// claims and slices may, their informers), all until ctx is done (wait waits for them), and waits for their first lists. It returns false when ctx
// ended first.
func (c *clusterCache) start(ctx context.Context) bool {
	c.wg.Go(func() { c.nodes.RunWithContext(ctx) })
	synced := []cache.InformerSynced{c.nodes.HasSynced}
	if err := c.startPods(ctx); err == nil {
		synced = append(synced, c.pods.hasSynced)
	}
	if claimsSynced, err := c.claims.start(ctx, &c.wg); err == nil {
		synced = append(synced, claimsSynced)
	}
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}

// wait waits for the caches' goroutines, once the context given to start is done.
func (c *clusterCache) wait() { c.wg.Wait() }

// read returns what the caches hold. Pods, claims or slices that may not be listed yet are asked
// for again.
func (c *clusterCache) read(ctx context.Context) (Input, error) {
	if !c.nodes.HasSynced() {
		return Input{}, errors.New("the Nodes are not listed yet")
	}
	var in Input
	for _, obj := range c.nodes.GetStore().List() {
		if n, ok := obj.(*corev1.Node); ok {
			in.Nodes = append(in.Nodes, n)
		}
	}
	if c.claims.claims == nil {
		_, in.ClaimsErr = c.claims.start(ctx, &c.wg)
	}
	if in.ClaimsErr == nil {
		in.Claims, in.Devices, in.ClaimsErr = c.claims.read()
	}
	if c.pods == nil {
		if err := c.startPods(ctx); err != nil {
			in.PodsErr = err
			return in, nil
		}
	}
	var ok bool
	if in.Pods, ok = c.pods.list(); !ok {
		in.PodsErr = errors.New("the pods are not listed yet")
	}
	return in, nil
}

// startPods starts the pods' reflector, unless a one-item LIST says pods may not be listed.
func (c *clusterCache) startPods(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	pods := c.client.CoreV1().Pods(metav1.NamespaceAll)
	_, err := pods.List(ctx, metav1.ListOptions{FieldSelector: runningPods, Limit: 1})
	switch {
	case apierrors.IsForbidden(err):
		if !c.forbidden {
			logger.Info("Warning: judging the fleet without workloads: pods may not be listed, so a job's signature counts as its GPUs' faults; asking again every period",
				"err", err)
		}
		c.forbidden = true
		return err
	case err != nil:
		return fmt.Errorf("list pods: %w", err)
	}
	if c.forbidden {
		logger.Info("Pods may be listed now: judging with workloads again")
		c.forbidden = false
	}
	c.pods = newPodCache()
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = runningPods
			return pods.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = runningPods
			return pods.Watch(ctx, opts)
		},
	}, c.client)
	r := cache.NewReflectorWithOptions(lw, &corev1.Pod{}, c.pods, cache.ReflectorOptions{Name: "fleet-pods", Logger: &logger})
	c.wg.Go(func() { r.RunWithContext(ctx) })
	return nil
}

// podCache is a reflector's store of the running pods that keeps only the pods that give a
// workload a GPU, and of each only fleet.WorkloadPod. It is a cache.TransformingStore: client-go's
// watch-list then streams the initial list through transform, which maps every other pod to one
// placeholder, so that not even the initial list holds them.
type podCache struct {
	mu     sync.Mutex
	pods   map[string]fleet.WorkloadPod // by namespace/name
	synced bool
	// none stands for every pod that gives no workload a GPU.
	none *cachedPod
}

// cachedPod is what transform makes of a pod: its key, for client-go's stores, and what Collect
// reads.
type cachedPod struct {
	metav1.ObjectMeta // Namespace and Name only
	pod               fleet.WorkloadPod
}

var _ cache.TransformingStore = (*podCache)(nil)

func newPodCache() *podCache {
	return &podCache{pods: map[string]fleet.WorkloadPod{}, none: &cachedPod{ObjectMeta: metav1.ObjectMeta{Name: "-"}}}
}

// Transformer implements cache.TransformingStore.
func (c *podCache) Transformer() cache.TransformFunc { return c.transform }

func (c *podCache) transform(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	if wp, ok := fleet.WorkloadPodOf(p); ok {
		return &cachedPod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}, pod: wp}, nil
	}
	return c.none, nil
}

// entry returns obj's key and what to keep of it (nil: nothing, and its key, if any, is removed).
func (c *podCache) entry(obj any) (string, *cachedPod) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	t, _ := c.transform(obj)
	switch o := obj.(type) {
	case *corev1.Pod:
		key := o.Namespace + "/" + o.Name
		if cp, ok := t.(*cachedPod); ok && cp != c.none {
			return key, cp
		}
		return key, nil
	case *cachedPod:
		if o == c.none {
			return "", nil
		}
		return o.Namespace + "/" + o.Name, o
	}
	return "", nil
}

// Add implements cache.ReflectorStore.
func (c *podCache) Add(obj any) error { return c.Update(obj) }

// Update implements cache.ReflectorStore: a pod that no longer names a card is removed.
func (c *podCache) Update(obj any) error {
	key, cp := c.entry(obj)
	c.mu.Lock()
	defer c.mu.Unlock()
	if cp == nil {
		delete(c.pods, key)
	} else {
		c.pods[key] = cp.pod
	}
	return nil
}

// Delete implements cache.ReflectorStore.
func (c *podCache) Delete(obj any) error {
	key, _ := c.entry(obj)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pods, key)
	return nil
}

// Replace implements cache.ReflectorStore: the list is every running pod (or, streamed, what
// transform made of them).
func (c *podCache) Replace(list []any, _ string) error {
	pods := map[string]fleet.WorkloadPod{}
	for _, obj := range list {
		if key, cp := c.entry(obj); cp != nil {
			pods[key] = cp.pod
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods, c.synced = pods, true
	return nil
}

// Resync implements cache.ReflectorStore; there is nothing to resync.
func (c *podCache) Resync() error { return nil }

func (c *podCache) hasSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// list returns the pods kept, and false before the first list.
func (c *podCache) list() ([]fleet.WorkloadPod, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]fleet.WorkloadPod, 0, len(c.pods))
	for _, p := range c.pods {
		out = append(out, p)
	}
	return out, c.synced
}
