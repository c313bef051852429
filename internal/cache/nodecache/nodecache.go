// Package nodecache is the agent's view of its own Node: one informer, selected to that Node by
// name, that every reporter and the drains watcher share (one watch per agent instead of one per
// user), plus the objects the agent's own writes returned. It reads; writing the Node's
// annotations is report.AnnotationWriter's job.
//
// Reading from an informer saves a GET before every write (at fleet scale, two requests per node
// and change), but an informer lags behind the agent's own writes: right after a patch it may still
// hold the Node from before, and a writer that went back to the earlier value would then see
// nothing to do. Get therefore returns the newer of the informer's copy and the last object a write
// returned, comparing resource versions; a write by someone else after ours is newer and wins, and
// one before ours is already in the object our write returned. Where resource versions cannot be
// compared, or the informer has not started, Get asks the API server.
package nodecache

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuhealth/gpuhealth/internal/kube"
)

// Cache follows one Node. Its methods are safe for concurrent use.
type Cache struct {
	client    kube.Interface
	nodeName  string
	informers kube.Informers
	informer  cache.SharedIndexInformer

	startOnce sync.Once
	startErr  error

	mu      sync.Mutex
	started bool         // the informer has synced
	written *corev1.Node // the newest Node a write of ours returned
	// changed is closed (and replaced) whenever the informer's copy changes; WaitCaughtUp
	// waits on it.
	changed chan struct{}
}

// New returns a Cache of nodeName; nothing runs until Start.
func New(client kube.Interface, nodeName string) *Cache {
	c := &Cache{client: client, nodeName: nodeName, changed: make(chan struct{})}
	c.informer = c.informers.Add(kube.NewInformer(client, client.CoreV1().Nodes(), &corev1.Node{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	// Registered before the informer runs, so it cannot fail.
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { c.notifyChanged() },
		UpdateFunc: func(any, any) { c.notifyChanged() },
		DeleteFunc: func(any) { c.notifyChanged() },
	})
	return c
}

func (c *Cache) notifyChanged() {
	c.mu.Lock()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// WaitCaughtUp returns once the informer holds the Node as of the newest write of ours, or when
// ctx ends, or at once when the informer has not started or resource versions cannot be compared.
// The informer's watch is served as every other watch of the Node is (a scheduler's or an
// extender's), so once it has our write, those have been sent it too: the agent waits here before
// it sends writes that nobody schedules by, which would otherwise compete with that delivery on a
// busy API server.
func (c *Cache) WaitCaughtUp(ctx context.Context) {
	for {
		c.mu.Lock()
		started, written, changed := c.started, c.written, c.changed
		c.mu.Unlock()
		if !started || written == nil {
			return
		}
		obj, exists, err := c.informer.GetStore().GetByKey(c.nodeName)
		cached, _ := obj.(*corev1.Node)
		if err != nil || !exists || cached == nil {
			return
		}
		cmp, err := resourceversion.CompareResourceVersion(cached.ResourceVersion, written.ResourceVersion)
		if err != nil || cmp >= 0 {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// NodeName is the Node the cache follows.
func (c *Cache) NodeName() string { return c.nodeName }

// AddEventHandler registers h for changes to the Node. Handlers added after Start first receive
// the Node as an add, as with any shared informer.
func (c *Cache) AddEventHandler(h cache.ResourceEventHandler) error {
	_, err := c.informer.AddEventHandler(h)
	return err
}

// Start runs the informer until ctx is done and returns once its cache is filled (a field-selected
// LIST of one Node). Every caller may call it; the informer starts once.
func (c *Cache) Start(ctx context.Context) error {
	c.startOnce.Do(func() {
		c.informers.Start(ctx)
		if err := c.informers.WaitForCacheSync(ctx); err != nil {
			c.startErr = fmt.Errorf("nodecache: %w", err)
			return
		}
		c.mu.Lock()
		c.started = true
		c.mu.Unlock()
	})
	return c.startErr
}

// Shutdown waits for the informer's goroutines after the context given to Start is done.
func (c *Cache) Shutdown() { c.informers.Shutdown() }

// Wrote records the Node a write of ours returned, so that Get never returns an older one.
func (c *Cache) Wrote(n *corev1.Node) {
	if n == nil || n.Name != c.nodeName {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.written != nil {
		if cmp, err := resourceversion.CompareResourceVersion(n.ResourceVersion, c.written.ResourceVersion); err == nil && cmp < 0 {
			return
		}
	}
	c.written = n
}

// Get returns the Node as of the latest change the agent knows about. The object is shared: do
// not modify it.
func (c *Cache) Get(ctx context.Context) (*corev1.Node, error) {
	c.mu.Lock()
	started, written := c.started, c.written
	c.mu.Unlock()
	if !started {
		return c.Refresh(ctx)
	}
	obj, exists, err := c.informer.GetStore().GetByKey(c.nodeName)
	if err != nil {
		return c.Refresh(ctx)
	}
	cached, _ := obj.(*corev1.Node)
	switch {
	case !exists || cached == nil:
		// Not in the cache: the Node is new, or gone. The API server knows which.
		return c.Refresh(ctx)
	case written == nil:
		return cached, nil
	}
	cmp, err := resourceversion.CompareResourceVersion(cached.ResourceVersion, written.ResourceVersion)
	switch {
	case err != nil:
		return c.Refresh(ctx)
	case cmp >= 0:
		return cached, nil
	default:
		return written, nil
	}
}

// Refresh reads the Node from the API server, past the informer, for a writer that must see the
// Node as it is now (the API server refused a write made on an older copy); Get returns nothing
// older afterwards.
func (c *Cache) Refresh(ctx context.Context) (*corev1.Node, error) {
	n, err := c.client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", c.nodeName, err)
	}
	c.Wrote(n) // not a write, but just as fresh
	return n, nil
}
