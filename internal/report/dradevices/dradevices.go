// Package dradevices finds this node's GPUs among DRA devices: it keeps an informer cache of the
// node's ResourceSlices of one driver and indexes their devices by the attribute that carries the
// GPU UUID (bare, as the NVIDIA DRA driver publishes it, or qualified with the driver's domain).
// The devicetaint and claimstatus reporters share one Index per agent: one watch, one cache.
package dradevices

import (
	"context"
	"fmt"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
)

// Device names a DRA device.
type Device struct{ Pool, Name string }

// Index is the cache of one node's devices of one driver. Its methods are safe for concurrent use.
type Index struct {
	nodeName, driver string
	bare, qualified  resourceapi.QualifiedName
	factory          informers.SharedInformerFactory
	informer         cache.SharedIndexInformer
	slices           resourcelisters.ResourceSliceLister

	startOnce sync.Once
	startErr  error
}

// New returns the Index of nodeName's devices of driver whose attribute uuidAttribute (bare or
// qualified with the driver's name) carries the GPU UUID. Nothing runs until Start.
func New(client kubernetes.Interface, nodeName, driver, uuidAttribute string) *Index {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.AndSelectors(
				fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, nodeName),
				fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver),
			).String()
		}))
	inf := factory.Resource().V1().ResourceSlices()
	return &Index{
		nodeName: nodeName, driver: driver, factory: factory, informer: inf.Informer(), slices: inf.Lister(),
		bare: resourceapi.QualifiedName(uuidAttribute), qualified: resourceapi.QualifiedName(driver + "/" + uuidAttribute),
	}
}

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
		ix.factory.Start(ctx.Done())
		for typ, ok := range ix.factory.WaitForCacheSync(ctx.Done()) {
			if !ok {
				ix.startErr = fmt.Errorf("cache of %v did not sync", typ)
			}
		}
	})
	return ix.startErr
}

// Attach is how a reporter gets its devices: the agent's shared Index ix, or a new one of its own
// when ix is nil, with onChange registered and the cache filled.
func Attach(ctx context.Context, ix *Index, client kubernetes.Interface, nodeName, driver, uuidAttribute string, onChange func()) (*Index, error) {
	if ix == nil {
		ix = New(client, nodeName, driver, uuidAttribute)
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
func (ix *Index) Shutdown() { ix.factory.Shutdown() }

// OnAnyChange is an event handler that calls f on every add, update and delete.
func OnAnyChange(f func()) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { f() },
		UpdateFunc: func(any, any) { f() },
		DeleteFunc: func(any) { f() },
	}
}

// Visit calls f for every device of the node and driver that carries a GPU UUID (lower case).
func (ix *Index) Visit(f func(uuid string, d Device)) error {
	list, err := ix.slices.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list ResourceSlices: %w", err)
	}
	for _, slice := range list {
		if slice.Spec.Driver != ix.driver || slice.Spec.NodeName == nil || *slice.Spec.NodeName != ix.nodeName {
			continue
		}
		for _, dev := range slice.Spec.Devices {
			attr, ok := dev.Attributes[ix.bare]
			if !ok {
				attr, ok = dev.Attributes[ix.qualified]
			}
			if ok && attr.StringValue != nil {
				f(strings.ToLower(*attr.StringValue), Device{Pool: slice.Spec.Pool.Name, Name: dev.Name})
			}
		}
	}
	return nil
}

// ByUUID returns the devices of each GPU UUID (lower case).
func (ix *Index) ByUUID() (map[string][]Device, error) {
	out := map[string][]Device{}
	err := ix.Visit(func(uuid string, d Device) { out[uuid] = append(out[uuid], d) })
	return out, err
}

// UUIDs returns the GPU UUID (lower case) of each device.
func (ix *Index) UUIDs() (map[Device]string, error) {
	out := map[Device]string{}
	err := ix.Visit(func(uuid string, d Device) { out[d] = uuid })
	return out, err
}
