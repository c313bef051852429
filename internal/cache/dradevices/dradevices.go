// Package dradevices is the agent's informer cache of its node's ResourceSlices of one driver,
// read as a dra.Catalog: which DRA devices a GPU's health applies to (the matching itself, by
// UUID, parent UUID and PCI address, is pkg/dra's, where DRA drivers embed it too). The
// devicetaint and claimstatus reporters and remediation share one Index per agent: one watch,
// one cache, each problem with the slices logged once.
package dradevices

import (
	"context"
	"fmt"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/pkg/dra"
)

// Index is the cache of one node's devices of one driver. Its methods are safe for concurrent use.
type Index struct {
	nodeName, driver string
	attrs            dra.Attributes
	informers        kube.Informers
	informer         cache.SharedIndexInformer
	slices           resourcelisters.ResourceSliceLister

	startOnce sync.Once
	startErr  error

	mu       sync.Mutex
	reported map[string]bool // problems logged, so that each is logged once while it lasts
}

// New returns the Index of nodeName's devices of driver, with uuidAttribute carrying the GPU
// UUID and the default names for the other attributes. Nothing runs until Start.
func New(client kube.Interface, nodeName, driver, uuidAttribute string) *Index {
	return NewWithAttributes(client, nodeName, driver, dra.Attributes{UUID: uuidAttribute})
}

// NewWithAttributes returns the Index of nodeName's devices of driver, tied to GPUs by attrs
// (empty names take the defaults; see dra.Attributes.Validate). Nothing runs until Start.
func NewWithAttributes(client kube.Interface, nodeName, driver string, attrs dra.Attributes) *Index {
	ix := &Index{nodeName: nodeName, driver: driver, attrs: attrs.WithDefaults(), reported: map[string]bool{}}
	ix.informer = ix.informers.Add(kube.NewInformer(client, client.ResourceV1().ResourceSlices(), &resourceapi.ResourceSlice{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.AndSelectors(
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, nodeName),
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver),
		).String()
	}))
	ix.slices = resourcelisters.NewResourceSliceLister(ix.informer.GetIndexer())
	return ix
}

// Attributes returns the attribute names the index matches by.
func (ix *Index) Attributes() dra.Attributes { return ix.attrs }

// OnChange calls f for every change to the node's slices (a driver may publish them after the
// agent starts).
func (ix *Index) OnChange(f func()) error {
	_, err := ix.informer.AddEventHandler(OnAnyChange(f))
	return err
}

// Start runs the cache until ctx is done and returns once it is filled. Every user may call it;
// the informer starts once.
func (ix *Index) Start(ctx context.Context) error {
	ix.startOnce.Do(func() {
		ix.informers.Start(ctx)
		ix.startErr = ix.informers.WaitForCacheSync(ctx)
	})
	return ix.startErr
}

// Source is which devices an Index caches: Node's ResourceSlices of Driver, read through Client,
// tied to GPUs by Attributes (empty names take the defaults).
type Source struct {
	Client       kube.Interface
	Node, Driver string
	Attributes   dra.Attributes
}

// Attach is how a reporter gets its devices: the agent's shared Index ix, or a new one of src's
// own when ix is nil, with onChange registered and the cache filled. src.Attributes must be
// valid and, for a shared index, the ones it matches by.
func Attach(ctx context.Context, ix *Index, src Source, onChange func()) (*Index, error) {
	attrs := src.Attributes.WithDefaults()
	if err := attrs.Validate(); err != nil {
		return nil, fmt.Errorf("DRA device attributes: %w", err)
	}
	if ix == nil {
		ix = NewWithAttributes(src.Client, src.Node, src.Driver, attrs)
	}
	if ix.attrs != attrs {
		return nil, fmt.Errorf("the shared device index matches by %+v, not by the configured %+v", ix.attrs, attrs)
	}
	if err := ix.OnChange(onChange); err != nil {
		return nil, err
	}
	if err := ix.Start(ctx); err != nil {
		return nil, err
	}
	return ix, nil
}

// Shutdown waits for the informer's goroutines after the context given to Start is done.
func (ix *Index) Shutdown() { ix.informers.Shutdown() }

// OnAnyChange is an event handler that calls f on every add, update and delete.
func OnAnyChange(f func()) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	}
}

// Catalog reads the node's devices as the cache has them now (dra.NewCatalog). Each problem with
// the slices is logged once while it lasts, however many reporters ask.
func (ix *Index) Catalog(ctx context.Context) (*dra.Catalog, error) {
	list, err := ix.slices.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	c, problems := dra.NewCatalog(list, ix.nodeName, ix.driver, ix.attrs)
	ix.report(ctx, problems)
	return c, nil
}

func (ix *Index) report(ctx context.Context, problems []dra.Problem) {
	logger := klog.FromContext(ctx)
	ix.mu.Lock()
	defer ix.mu.Unlock()
	now := make(map[string]bool, len(problems))
	for _, p := range problems {
		key := p.String()
		now[key] = true
		if !ix.reported[key] {
			logger.Info("ResourceSlice problem: a GPU fault may not reach this DRA device as published",
				"driver", ix.driver, "pool", p.Pool, "device", p.Device, "attribute", p.Attribute, "problem", p.What)
		}
	}
	ix.reported = now
}
