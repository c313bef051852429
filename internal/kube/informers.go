package kube

import (
	"context"
	"fmt"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ListerWatcher is the list and watch of one resource (a Client, or client-go's metadata client
// of one resource).
type ListerWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer returns a shared informer of the objects lw lists, with tweak (may be nil) applied
// to every list and watch: what client-go's generated informers build, with the namespace index
// that their listers use. client is the Interface lw comes from; a client that cannot serve
// streaming lists (client-go's fake) says so through it, as with client-go's informers.
func NewInformer[L runtime.Object](client any, lw ListerWatcher[L], obj runtime.Object, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	return cache.NewSharedIndexInformer(
		cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				tweak(&opts)
				return lw.List(ctx, opts)
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				tweak(&opts)
				return lw.Watch(ctx, opts)
			},
		}, client),
		obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// Informers runs informers started together, as client-go's SharedInformerFactory does for its
// own: Start runs them all until ctx is done, WaitForCacheSync waits for their caches, and
// Shutdown waits for their goroutines.
type Informers struct {
	mu        sync.Mutex
	informers []cache.SharedIndexInformer
	started   int // informers[:started] run
	wg        sync.WaitGroup
}

// Add registers inf (not yet started) and returns it.
func (f *Informers) Add(inf cache.SharedIndexInformer) cache.SharedIndexInformer {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.informers = append(f.informers, inf)
	return inf
}

// Start runs every informer not yet started until ctx is done.
func (f *Informers) Start(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, inf := range f.informers[f.started:] {
		f.wg.Go(func() { inf.RunWithContext(ctx) })
	}
	f.started = len(f.informers)
}

// WaitForCacheSync returns once every started informer's cache is filled, or an error when ctx
// ends first.
func (f *Informers) WaitForCacheSync(ctx context.Context) error {
	f.mu.Lock()
	synced := make([]cache.InformerSynced, 0, f.started)
	for _, inf := range f.informers[:f.started] {
		synced = append(synced, inf.HasSynced)
	}
	f.mu.Unlock()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informer caches did not sync: %w", context.Cause(ctx))
	}
	return nil
}

// Shutdown waits for the informers' goroutines; call it after the context given to Start is done.
func (f *Informers) Shutdown() { f.wg.Wait() }

// Work is a controller's loop: it starts informers, waits for their caches (an error names
// what, the worker), then hands each key of queue to process, one at a time, until ctx ends,
// when the queue and the informers are shut down. process decides what becomes of its key
// (Forget, AddRateLimited, AddAfter); Work marks it done.
func Work[K comparable](ctx context.Context, what string, informers *Informers, queue workqueue.TypedRateLimitingInterface[K], process func(K)) error {
	informers.Start(ctx)
	defer informers.Shutdown()
	if err := informers.WaitForCacheSync(ctx); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		key, quit := queue.Get()
		if quit {
			return nil
		}
		process(key)
		queue.Done(key)
	}
}

// Handlers returns informer handlers that call set with each added or updated object of type T
// and, when del is not nil, del with each deleted one (unwrapping the tombstone of a delete the
// watch missed). Objects of other types are passed over.
func Handlers[T any](set, del func(T)) cache.ResourceEventHandlerFuncs {
	typed := func(f func(T)) func(any) {
		return func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if t, ok := obj.(T); ok {
				f(t)
			}
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: typed(set)}
	h.UpdateFunc = func(_, obj any) { h.AddFunc(obj) }
	if del != nil {
		h.DeleteFunc = typed(del)
	}
	return h
}
